"""Running the app under uvicorn with Reef's settings: one process, or ``server.workers``
worker processes behind one port.

With ``server.workers=N`` (N > 1) this process binds the port and forks N workers that accept
on the one listening socket (the kernel spreads connections between them). Each worker is a
full server: its own kernel, runtime (a local model is loaded N times), record writer,
release follower and learning loop. The growth leases in the record store keep one growth
step per scenario at a time across them (``reef_core.grow.lease``). The supervisor restarts a
worker that dies, and stops all of them on SIGINT/SIGTERM.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import time

import uvicorn

from ..compose import build_reef
from ..config import Settings
from ..errors import ConfigError, ReefError, StartupError
from ..grow.explain import startup_notes
from ..kernel import Reef
from ..plugins import Plugins
from ..served_config import connect_url
from .gc_tuning import tune_for_serving

log = logging.getLogger("reef")


def effective_host(settings: Settings) -> tuple[str, str | None]:
    """The address to bind, and a warning about it (None when there is none to give).

    With no token configured the server binds to loopback only, whatever was asked.
    """
    host = settings.server.host
    if settings.auth.tokens:
        return host, None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return "127.0.0.1", (f"no auth token configured: binding to 127.0.0.1 instead of {host} "
                             "(set REEF_TOKEN or auth.tokens to serve other hosts)")
    return host, "no auth token configured: anyone on this machine can use the server"


def run_server(settings: Settings, plugins: Plugins) -> None:
    """Serve until interrupted: one uvicorn worker (uvloop and httptools when installed).

    Start-up happens before anything binds, in the event loop that then serves: the kernel is
    built, its runtime started (the model loaded) and the plugins' ``startup`` hooks run.
    A failure there, like a runtime that cannot serve as configured (``upstream`` without
    ``upstream_url``), is a ``ReefError`` naming what failed (``StartupError`` unless it is a
    config or plugin error), which the CLI prints as one line with exit code 2; the traceback is
    logged only at ``server.log_level=debug``. The app's lifespan then finds the kernel started.
    """
    from ..cli import configure_logging

    configure_logging(settings.server.log_level)
    if settings.server.workers > 1:
        _Supervisor(settings, plugins).run()
        return
    try:
        _serve(settings, plugins)
    except KeyboardInterrupt:  # SIGINT while starting, or re-raised after a graceful stop: as uvicorn.run does
        pass
    except ReefError as exc:
        log.debug("start-up failed", exc_info=exc)
        raise


def _serve(settings: Settings, plugins: Plugins, sock: socket.socket | None = None) -> None:
    """Build the kernel and serve it (on ``sock`` when given: a worker of ``_Supervisor``)."""
    from .app import create_app
    from .edge import uvicorn_options

    host, warning = effective_host(settings)
    if sock is None and settings.server.port:
        # the address is tried before start-up, which announces this server in the state directory
        # (served-config.json) and may load a model for minutes: a port in use, or a host that is no
        # address of this machine, stops it here in one line, the running server's record untouched
        _listen(host, settings.server.port).close()
    reef = build_reef(settings, plugins)
    problem = reef.runtime.config_problem()
    if problem:
        raise ConfigError(problem)
    app = create_app(reef)
    # recorded in <state_dir>/served-config.json at start, where the CLI looks for a running server
    app.state.listen_url = connect_url(host, settings.server.port)
    # connection-level bounds (slow clients, connection cap, header size, malformed framing): edge.py
    config = uvicorn.Config(app, host=host, port=settings.server.port,
                            log_level=settings.server.log_level, access_log=False,
                            # past it, what is still running is cut (serve.inference) and the process exits
                            timeout_graceful_shutdown=settings.server.shutdown_timeout_s,
                            **uvicorn_options(settings))
    _KernelFirstServer(config, reef, warning).run(sockets=[sock] if sock is not None else None)


#: a first-generation worker that fails to start (exit code 2) this soon after the supervisor
#: started stops the supervisor: a configuration or start-up error would only repeat. Later,
#: a replacement that fails the same way is started again after a growing pause (the others
#: keep serving; what stopped it may pass, like a store locked by a worker that just died).
_EARLY_EXIT_S = 5.0
_RESTART_PAUSE_S = (0.5, 30.0)
#: what stops the supervisor (and, passed on, its workers)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Supervisor:
    """``server.workers`` forked workers on one listening socket, restarted when they die."""

    def __init__(self, settings: Settings, plugins: Plugins):
        self.settings = settings
        self.plugins = plugins
        self.children: dict[int, float] = {}  # pid → start time
        self.first: set[int] = set()  # the workers started with the supervisor
        self.stopping = False
        self._pause = _RESTART_PAUSE_S[0]

    def run(self) -> None:
        host, _ = effective_host(self.settings)
        sock = _listen(host, self.settings.server.port)
        log.info("serving on %s with %d worker processes", connect_url(host, self.settings.server.port),
                 self.settings.server.workers)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, self._stop)
        failed = None
        try:
            for _ in range(self.settings.server.workers):
                if (pid := self._spawn(sock)) is not None:
                    self.first.add(pid)
            while self.children:
                try:
                    pid, status = os.wait()
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
                started = self.children.pop(pid, None)
                if started is None or self.stopping:
                    continue
                code = os.waitstatus_to_exitcode(status)
                lived = time.monotonic() - started
                if code == 2 and lived < _EARLY_EXIT_S and pid in self.first:
                    failed = f"worker {pid} failed to start (exit code {code}); stopping the other workers"
                    self._stop()
                    continue
                # a worker that dies young again and again is restarted ever more slowly
                self._pause = min(self._pause * 2, _RESTART_PAUSE_S[1]) if lived < _EARLY_EXIT_S \
                    else _RESTART_PAUSE_S[0]
                log.warning("worker %d exited (code %s); starting another in %.1fs", pid, code, self._pause)
                until = time.monotonic() + self._pause
                while not self.stopping and time.monotonic() < until:
                    time.sleep(0.1)
                if not self.stopping:
                    self._spawn(sock)
        finally:
            sock.close()
        if failed:
            raise StartupError(failed)

    def _spawn(self, sock: socket.socket) -> int | None:
        """Fork a worker; its pid, or None when a stop came in since the caller looked.

        SIGINT and SIGTERM wait (blocked) while the worker is forked and recorded: a stop
        handled in between would not reach a worker the supervisor does not know yet, and it
        would wait on that worker for ever (seen once: SIGTERM as a replacement started)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            pid = None if self.stopping else os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            raise
        if pid != 0:
            if pid is not None:
                self.children[pid] = time.monotonic()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # a stop that waited is handled here
            return pid
        code = 0
        try:  # the worker: uvicorn installs its own SIGINT/SIGTERM handlers for a graceful stop
            for sig in _STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            _serve(self.settings, self.plugins, sock)
        except KeyboardInterrupt:
            pass
        except ReefError as exc:
            log.error("worker %d: %s", os.getpid(), exc)
            code = 2
        except BaseException:  # noqa: BLE001 - a worker reports whatever ended it, then exits
            log.exception("worker %d failed", os.getpid())
            code = 1
        finally:
            logging.shutdown()
            os._exit(code)

    def _stop(self, *_: object) -> None:
        self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` that forked workers inherit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _KernelFirstServer(uvicorn.Server):
    """uvicorn's server, with the kernel started in ``serve()`` before uvicorn's own start-up.

    ``run()`` stays uvicorn's, so the event loop (uvloop when installed) is the one uvicorn
    would pick, and ``serve()`` still captures SIGINT/SIGTERM for a graceful shutdown.
    """

    def __init__(self, config: uvicorn.Config, reef: Reef, warning: str | None):
        super().__init__(config)
        self.reef = reef
        self.warning = warning

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await self.reef.start()
        tune_for_serving(self.reef.settings.server.gc_young_threshold)
        if self.warning:
            log.warning("%s", self.warning)
        for level, line in startup_notes(self.reef):  # what learns, from what, and how to change it
            log.log(level, "%s", line)
        try:
            await super().serve(sockets)
        finally:
            if self.reef.started:  # uvicorn stopped before the app's lifespan took the kernel over
                await self.reef.stop()
