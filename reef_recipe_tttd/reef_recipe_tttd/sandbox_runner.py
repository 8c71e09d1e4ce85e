"""Runs one untrusted program inside the judge's sandbox (``python -I -S sandbox_runner.py``).

Started by ``reef_recipe_tttd.judge`` in a fresh temporary directory (the working directory)
under CPU, memory, file-size and wall-clock limits. Before the program runs, an audit hook
confines it: files open for reading only inside the temporary directory and Python's own
library, for writing only inside the temporary directory; no process creation, no network, no
native library loading. A denied action raises ``PermissionError`` in the program. This module
imports nothing from Reef: it runs with the standard library only.
"""

import os
import sys

HERE = os.path.realpath(os.getcwd())
READABLE = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                  os.path.dirname(os.__file__))} | {HERE})
DENIED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "os.kill", "os.killpg", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.__new__",
          "ctypes.dlopen", "ctypes.dlsym", "os.chdir", "os.chroot", "sys.setrecursionlimit_unsafe"}
PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.chmod", "os.chown",
               "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}


def _inside(path, roots):
    try:
        real = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "")
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def _guard(event, args):
    if event in DENIED:
        raise PermissionError(f"the judge's sandbox does not allow {event}")
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            return
        writes = any(c in (mode or "") for c in "wax+") or (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if not _inside(path, (HERE,) if writes else READABLE):
            raise PermissionError(f"the judge's sandbox does not allow opening {path!r} here")
    elif event in PATH_EVENTS:
        for path in args:
            if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path, (HERE,)):
                raise PermissionError(f"the judge's sandbox does not allow {event} on {path!r}")


def main():
    with open("program.py", encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "program.py", "exec")
    sys.addaudithook(_guard)
    exec(code, {"__name__": "__main__"})


if __name__ == "__main__":
    main()
