"""The host names a server answers to (``server.allowed_hosts``), against DNS rebinding.

A page on ``evil.example`` whose name the attacker then resolves to 127.0.0.1 talks to a Reef
on loopback as its own origin: it could read every record and drive the dashboard. The browser
still sends ``Host: evil.example``, so a server that answers only to its own names is out of
reach. Always accepted: the bind address, ``localhost``, ``127.0.0.1`` and ``[::1]``; with a
wildcard bind (``0.0.0.0``, ``::``) any IP address as well, since a rebound request always
names the attacker's domain, never an address. ``server.allowed_hosts`` adds names: ``name``
on any port, ``name:port`` on that port only; ``*`` accepts every host (the check is off).

Pure parsing, no FastAPI: the config validates ``server.allowed_hosts`` with it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

#: names every server answers to (loopback only: no DNS answer of an attacker can stand behind them)
ALWAYS_ALLOWED = ("localhost", "127.0.0.1", "::1")
#: bind addresses that listen on every interface
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
#: what a host name may hold (lowercased; RFC 1123 labels, plus ``_`` of container names)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")
#: raw ``Host`` values remembered as accepted, so that the usual few skip parsing
_ACCEPTED_CACHE = 256


def parse_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header: ``name``, ``name:port``, ``[ipv6]`` or ``[ipv6]:port``.

    The name comes back lowercased, an IP address in its canonical form (``[0:0::1]`` is
    ``::1``), the port as a number or None when absent. None when the value is none of these
    (an empty name, a stray colon, a port that is not 0-65535, characters no host name has).
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        try:
            name = str(ipaddress.IPv6Address(value[1:end]))
        except ValueError:
            return None
        rest = value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text = value.partition(":")
        if not colon:
            port_text = None
        if not name or not name.isascii():
            return None
        name = name.lower()
        if not _NAME_CHARS.issuperset(name):
            return None
        try:
            name = str(ipaddress.IPv4Address(name))
        except ValueError:
            pass
    port = None
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or int(port_text) > 65535:
            return None
        port = int(port_text)
    return name, port


def parse_allowed(entry: str) -> tuple[str, int | None]:
    """An entry of ``server.allowed_hosts`` as ``(name, port)``; ``ValueError`` saying what is
    wrong with it. Besides what a ``Host`` header holds, a bare IPv6 address (``::1``) is accepted."""
    text = entry.strip()
    try:
        return str(ipaddress.IPv6Address(text)), None
    except ValueError:
        pass
    parsed = parse_host(text)
    if parsed is None:
        raise ValueError(f"{entry!r} is not a host name or IP address with an optional :port "
                         f"(e.g. reef.example.com, reef.example.com:8443, 10.0.0.5, [::1]:8900), nor '*'")
    return parsed


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AllowedHosts:
    """Which ``Host`` values a server accepts (see the module docstring)."""

    def __init__(self, entries: Iterable[str], *, any_ip: bool = False):
        self.any_host = False
        self.any_ip = any_ip
        self._any_port: set[str] = set()
        self._on_port: set[tuple[str, int]] = set()
        for entry in entries:
            if entry.strip() == "*":
                self.any_host = True
                continue
            name, port = parse_allowed(entry)
            if port is None:
                self._any_port.add(name)
            else:
                self._on_port.add((name, port))
        self._accepted: set[bytes] = set()

    @classmethod
    def for_server(cls, bind: str, allowed_hosts: Iterable[str]) -> AllowedHosts:
        """The names of a server bound to ``bind`` with ``server.allowed_hosts`` set to ``allowed_hosts``."""
        entries = [*ALWAYS_ALLOWED, *allowed_hosts]
        wildcard = bind.strip() in WILDCARD_BINDS
        if not wildcard:
            try:
                parse_allowed(bind)
            except ValueError:  # not a name a client could send (uvicorn resolves what it binds)
                pass
            else:
                entries.append(bind)
        return cls(entries, any_ip=wildcard)

    def allows(self, name: str, port: int | None) -> bool:
        """Whether a parsed ``Host`` (:func:`parse_host`) is one of these."""
        if self.any_host or name in self._any_port or (port is not None and (name, port) in self._on_port):
            return True
        return self.any_ip and is_ip_address(name)

    def check(self, raw: bytes) -> tuple[int, str] | None:
        """None when the raw ``Host`` header is accepted, else ``(status, message)``: 400 for a
        value that is not a host at all, 421 for a host this server does not answer to."""
        if raw in self._accepted or self.any_host:
            return None
        value = raw.decode("latin-1")
        parsed = parse_host(value)
        if parsed is None:
            return 400, f"the Host header {value[:200]!r} is not a host name or IP address with an optional :port"
        if not self.allows(*parsed):
            return 421, (f"this server does not answer to the host {value[:200]!r}: if clients reach it by that "
                         f"name, add it to server.allowed_hosts (other names are refused so that a web page "
                         f"cannot reach Reef by DNS rebinding)")
        if len(self._accepted) < _ACCEPTED_CACHE:
            self._accepted.add(raw)
        return None
