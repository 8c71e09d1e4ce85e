"""Running the app under uvicorn with Reef's settings."""

from __future__ import annotations

import ipaddress
import logging
import socket

import uvicorn

from ..compose import build_reef
from ..config import Settings
from ..errors import ConfigError, ReefError
from ..kernel import Reef
from ..plugins import Plugins
from ..served_config import connect_url

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
    from .app import create_app
    from .edge import uvicorn_options

    configure_logging(settings.server.log_level)
    try:
        reef = build_reef(settings, plugins)
        problem = reef.runtime.config_problem()
        if problem:
            raise ConfigError(problem)
        host, warning = effective_host(settings)
        app = create_app(reef)
        # recorded in <state_dir>/served-config.json at start, where the CLI looks for a running server
        app.state.listen_url = connect_url(host, settings.server.port)
        # connection-level bounds (slow clients, connection cap, header size, malformed framing): edge.py
        config = uvicorn.Config(app, host=host, port=settings.server.port,
                                log_level=settings.server.log_level, access_log=False, timeout_graceful_shutdown=30,
                                **uvicorn_options(settings))
        _KernelFirstServer(config, reef, warning).run()
    except KeyboardInterrupt:  # SIGINT while starting, or re-raised after a graceful stop: as uvicorn.run does
        pass
    except ReefError as exc:
        log.debug("start-up failed", exc_info=exc)
        raise


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
        if self.warning:
            log.warning("%s", self.warning)
        try:
            await super().serve(sockets)
        finally:
            if self.reef.started:  # uvicorn stopped before the app's lifespan took the kernel over
                await self.reef.stop()
