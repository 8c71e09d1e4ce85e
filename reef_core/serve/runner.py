"""Running the app under uvicorn with Reef's settings."""

from __future__ import annotations

import ipaddress
import logging

from ..config import Settings
from ..plugins import Plugins

log = logging.getLogger("reef")


def effective_host(settings: Settings) -> str:
    """With no token configured the server binds to loopback only, whatever was asked."""
    host = settings.server.host
    if settings.auth.tokens:
        return host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        log.warning("no auth token configured: binding to 127.0.0.1 instead of %s "
                    "(set REEF_TOKEN or auth.tokens to serve other hosts)", host)
        return "127.0.0.1"
    log.warning("no auth token configured: anyone on this machine can use the server")
    return host


def run_server(settings: Settings, plugins: Plugins) -> None:
    """Serve until interrupted: one uvicorn worker (uvloop and httptools when installed).

    A runtime that cannot serve as configured (e.g. ``upstream`` without ``upstream_url``)
    is a ``ConfigError`` before anything binds, which the CLI prints as one line.
    """
    import uvicorn

    from ..cli import configure_logging
    from ..kernel import Reef
    from .app import create_app

    configure_logging(settings.server.log_level)
    host = effective_host(settings)
    reef = Reef(settings, plugins)
    problem = getattr(reef.runtime, "config_problem", None)
    if callable(problem) and problem():
        from ..errors import ConfigError

        raise ConfigError(problem())
    app = create_app(reef)
    from .edge import uvicorn_options

    # connection-level bounds (slow clients, connection cap, header size, malformed framing): edge.py
    uvicorn.run(app, host=host, port=settings.server.port, log_level=settings.server.log_level,
                access_log=False, timeout_graceful_shutdown=30, **uvicorn_options(settings))
