"""The one ``ssl.SSLContext`` an HTTP client uses to reach its upstream, built from the
``runtime.upstream_*`` TLS options and handed to whichever transport runs (Reef's own
``http1``, aiohttp's pool, httpx's), so all three trust the same CAs, check host names the
same way and present the same client certificate.

- No options: the system's CAs (``ssl.create_default_context()``, OpenSSL's default paths,
  which ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` override). httpx alone would trust certifi's
  bundle instead; here it gets this context like the others.
- ``ca_bundle``: a PEM file, or a directory in OpenSSL's hashed layout (``openssl rehash``),
  **replacing** the system's CAs, as curl's ``--cacert`` does: an upstream behind a private CA
  is then trusted for that CA only. Concatenate the system bundle into the file to keep both.
- ``client_cert`` and ``client_key`` (PEM; ``client_key_password`` when the key is
  encrypted): the certificate presented to an upstream that asks for one (mutual TLS).
- ``verify=False``: no certificate or host-name check at all; the caller logs a warning.

Every problem (a missing or unreadable file, a file that holds no certificate, a certificate
without its key, a wrong password) is a ``ValueError`` naming the option and the path, raised
while the context is built, i.e. at start-up, never on the first request.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

#: an entry of an OpenSSL hashed CA directory: the subject hash, a dot, a sequence number
_HASHED = re.compile(r"^[0-9a-f]{8}\.r?\d+$")


class _NoPassword(Exception):
    """The key is encrypted and no password was given (instead of OpenSSL's terminal prompt)."""


def client_ssl_context(*, ca_bundle: str | None = None, client_cert: str | None = None,
                       client_key: str | None = None, client_key_password: str | None = None,
                       verify: bool = True, prefix: str = "runtime.upstream_") -> ssl.SSLContext:
    """The context for TLS connections to an upstream; ``prefix`` names the options in errors."""
    name = {key: f"{prefix}{key}" for key in ("ca_bundle", "client_cert", "client_key", "client_key_password",
                                               "verify")}
    if not verify and ca_bundle:
        raise ValueError(f"{name['verify']} is false, so {name['ca_bundle']} would be ignored: "
                         f"remove one of them (a CA bundle with verification is the safe choice)")
    if client_cert and not client_key:
        raise ValueError(f"{name['client_cert']} is set but {name['client_key']} is not: "
                         f"a client certificate needs its private key (a PEM file)")
    if client_key and not client_cert:
        raise ValueError(f"{name['client_key']} is set but {name['client_cert']} is not: "
                         f"set the client certificate (a PEM file) that goes with the key")
    if client_key_password and not client_key:
        raise ValueError(f"{name['client_key_password']} is set but {name['client_key']} is not")
    if not verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_bundle:
        ctx = _with_ca_bundle(_existing(ca_bundle, name["ca_bundle"]), name["ca_bundle"])
    else:
        ctx = ssl.create_default_context()
    if client_cert and client_key:
        _load_client_cert(ctx, _file(client_cert, name["client_cert"]), _file(client_key, name["client_key"]),
                          client_key_password, name)
    return ctx


def _existing(path: str, option: str) -> Path:
    found = Path(path).expanduser()
    if not found.exists():
        raise ValueError(f"{option}: there is no file or directory at {found}")
    return found


def _file(path: str, option: str) -> Path:
    found = _existing(path, option)
    if not found.is_file():
        raise ValueError(f"{option}: {found} is not a file (a PEM file is expected)")
    try:
        with found.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"{option}: {found} cannot be read ({exc.strerror or exc})") from None
    return found


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason without the C source location (``... (_ssl.c:4154)``)."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc.args[1] if len(exc.args) > 1 else exc))


def _with_ca_bundle(path: Path, option: str) -> ssl.SSLContext:
    if path.is_dir():
        try:
            hashed = [entry for entry in path.iterdir() if _HASHED.match(entry.name)]
        except OSError as exc:
            raise ValueError(f"{option}: the directory {path} cannot be read ({exc.strerror or exc})") from None
        if not hashed:
            raise ValueError(f"{option}: the directory {path} has no certificates under OpenSSL's hashed names "
                             f"(run `openssl rehash {path}`), or name a PEM file instead")
        return ssl.create_default_context(capath=str(path))
    path = _file(str(path), option)
    try:
        return ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise ValueError(f"{option}: {path} holds no PEM certificate ({_reason(exc)})") from None


def _load_client_cert(ctx: ssl.SSLContext, cert: Path, key: Path, password: str | None,
                      name: dict[str, str]) -> None:
    try:  # the certificate alone first, so that a bad certificate is not blamed on the key
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(cert))
    except ssl.SSLError as exc:
        raise ValueError(f"{name['client_cert']}: {cert} holds no PEM certificate ({_reason(exc)})") from None

    def no_password() -> bytes:
        raise _NoPassword

    try:
        ctx.load_cert_chain(str(cert), str(key), password=password if password else no_password)
    except _NoPassword:
        raise ValueError(f"{name['client_key']}: {key} is encrypted; set {name['client_key_password']}") from None
    except ssl.SSLError as exc:
        why = ("the password is wrong, or the file is not a PEM private key" if password
               else "the file is not a PEM private key")
        if "KEY_VALUES_MISMATCH" in str(exc):
            why = f"it is not the private key of {cert}"
        raise ValueError(f"{name['client_key']}: {key} cannot be loaded: {why} ({_reason(exc)})") from None


__all__ = ["client_ssl_context"]
