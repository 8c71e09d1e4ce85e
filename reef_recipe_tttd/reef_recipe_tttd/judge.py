"""The judge: the only place a solution earns a score.

For an answer task the text is parsed and the objective recomputed by the task's verifier. For
a program task the program runs first in a sandbox: a subprocess (``sandbox_runner.py``) in a
fresh temporary directory, with a wall-clock limit, an ``RLIMIT_CPU`` limit, a memory limit and
a file-size limit, an environment holding nothing of the caller's, and an audit hook confining
its files to that directory (no processes, no network). Only its stdout comes back, and the
verifier — trusted code, in this process — recomputes the objective from it. A timeout, a crash
or an output the verifier rejects scores the task's invalid reward (0 by default).

The sandbox is a guard against accidents and careless programs on one machine, not a security
boundary against a hostile author: run untrusted code at scale in a container or VM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .tasks import Task, Verdict, invalid

RUNNER = Path(__file__).with_name("sandbox_runner.py")
#: bytes of a program's stdout / stderr kept
OUTPUT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8


@dataclass(frozen=True)
class ProgramRun:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool


def _limit(limits: Limits):
    def apply() -> None:  # runs in the child, before exec
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(source: str, limits: Limits = Limits()) -> ProgramRun:
    """Run ``source`` in the sandbox and return what it printed. The temporary directory is
    removed afterwards, whatever the program left in it."""
    work = Path(tempfile.mkdtemp(prefix="reef-tttd-judge-"))
    try:
        (work / "program.py").write_text(source, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(RUNNER)], cwd=work, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_limit(limits), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            timed_out = True
        # a CPU limit ends the program with SIGXCPU (or SIGKILL past the hard limit)
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            timed_out = True
        return ProgramRun(out[:OUTPUT_LIMIT].decode("utf-8", "replace"), err[-OUTPUT_LIMIT:].decode("utf-8", "replace"),
                          proc.returncode, timed_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Judge:
    """Scores solutions of one task: ``judge(text) -> Verdict``."""

    def __init__(self, task: Task, limits: Limits = Limits()):
        self.task = task
        self.limits = limits

    def __call__(self, reply: str) -> Verdict:
        task = self.task
        solution = task.extract(reply)
        if not solution:
            return invalid("empty solution", task.invalid_reward)
        if task.kind != "program":
            return task.verify(solution)
        run = run_program(solution, self.limits)
        if run.timed_out:
            return invalid(f"the program ran past its limit ({self.limits.wall_s:g} s wall, "
                           f"{self.limits.cpu_s} s CPU)", task.invalid_reward)
        if run.returncode != 0:
            tail = run.stderr.strip().splitlines()[-1:] or ["(no message)"]
            return invalid(f"the program failed (exit {run.returncode}): {tail[0][:200]}", task.invalid_reward)
        verdict = task.verify(run.stdout)
        return Verdict(verdict.score, verdict.raw, verdict.valid,
                       f"{verdict.message}\noutput:\n{run.stdout[-500:]}")
