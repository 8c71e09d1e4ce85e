"""Bad TLS options for the upstream are a clear start-up error naming the option, never a
stack trace or a failure on the first request.

Every combination of the options' kinds of values (a good file, a missing one, garbage, a
directory, a key that does not match, an encrypted key with the right, a wrong or no password)
is checked against an independent statement of which are valid; ``reef serve`` prints one line
and exits 2 (as in tests/test_startup_errors.py).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tls_pki import KEY_PASSWORD, make_pki

from reef_core.builtins.upstream import UpstreamRuntime

CA = ["none", "good", "missing", "garbage", "key_only", "unhashed_dir"]
CERT = ["none", "good", "missing", "garbage", "dir"]
KEY = ["none", "good", "missing", "garbage", "mismatch", "encrypted"]
PASSWORD = ["none", "right", "wrong"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """For each option, the path (or value) standing for each kind of value."""
    base = tmp_path_factory.mktemp("tls-config")
    pki = make_pki(base)
    (base / "garbage.pem").write_text("this is not PEM\n")
    (base / "unhashed").mkdir()
    (base / "unhashed" / "ca.pem").write_bytes(pki.ca.cert.read_bytes())
    missing = str(base / "nowhere" / "missing.pem")
    common = {"none": None, "missing": missing, "garbage": str(base / "garbage.pem")}
    return {
        "ca": {**common, "good": str(pki.ca.cert), "key_only": str(pki.server.key),
               "unhashed_dir": str(base / "unhashed")},
        "cert": {**common, "good": str(pki.client_encrypted.cert), "dir": str(base)},
        # the certificate is client_encrypted's: "good" is its key decrypted, "mismatch" another one
        "key": {**common, "good": _decrypted(pki.client_encrypted.key, base / "plain.key"),
                "mismatch": str(pki.client.key), "encrypted": str(pki.client_encrypted.key)},
        "password": {"none": None, "right": KEY_PASSWORD, "wrong": "battery staple"},
    }


def _decrypted(key: Path, to: Path) -> str:
    from cryptography.hazmat.primitives import serialization

    loaded = serialization.load_pem_private_key(key.read_bytes(), KEY_PASSWORD.encode())
    to.write_bytes(loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    return str(to)


def _problems(ca: str, cert: str, key: str, password: str, verify: bool) -> set[str]:
    """The options a correct error may name for this combination; empty when it is valid."""
    found: set[str] = set()
    if not verify and ca != "none":
        found |= {"upstream_verify", "upstream_ca_bundle"}
    if cert != "none" and key == "none":
        found |= {"upstream_client_cert", "upstream_client_key"}
    if key != "none" and cert == "none":
        found |= {"upstream_client_cert", "upstream_client_key"}
    if password != "none" and key == "none":
        found |= {"upstream_client_key_password", "upstream_client_key"}
    if verify and ca not in ("none", "good"):
        found.add("upstream_ca_bundle")
    if cert != "none" and key != "none":  # either may be the one named when both are wrong
        if cert != "good":
            found.add("upstream_client_cert")
        if key in ("missing", "garbage", "mismatch") or (key == "encrypted" and password != "right"):
            found |= {"upstream_client_key", "upstream_client_key_password"}
    return found


def test_every_combination_of_tls_options_builds_or_names_what_is_wrong(files):
    seen_valid = seen_invalid = 0
    for ca, cert, key, password, verify in itertools.product(CA, CERT, KEY, PASSWORD, (True, False)):
        problems = _problems(ca, cert, key, password, verify)
        options = {"upstream_ca_bundle": files["ca"][ca], "upstream_client_cert": files["cert"][cert],
                   "upstream_client_key": files["key"][key], "upstream_client_key_password": files["password"][password],
                   "upstream_verify": verify}
        case = f"ca={ca} cert={cert} key={key} password={password} verify={verify}"
        if not problems:
            runtime = UpstreamRuntime(upstream_url="https://upstream.test/v1", **options)
            assert runtime.ssl_context is not None, case
            assert runtime.ssl_context.check_hostname is verify, case
            seen_valid += 1
            continue
        with pytest.raises(ValueError) as err:
            UpstreamRuntime(upstream_url="https://upstream.test/v1", **options)
        message = str(err.value)
        named = {p for p in problems if f"runtime.{p}" in message}
        assert named, f"{case}: {message!r} names none of {sorted(problems)}"
        assert "\n" not in message and "_ssl.c" not in message, message
        seen_invalid += 1
    # valid: {no CA, good CA, no CA with verify off} x {no client cert, good cert and key (any password),
    # good cert and encrypted key with its password}
    assert (seen_valid, seen_invalid) == (15, 1065)


def test_a_missing_file_is_named_with_its_path(files):
    with pytest.raises(ValueError, match=r"runtime\.upstream_ca_bundle: there is no file or directory at .*missing\.pem"):
        UpstreamRuntime(upstream_url="https://upstream.test/v1", upstream_ca_bundle=files["ca"]["missing"])


def test_an_encrypted_key_without_its_password_asks_for_it(files):
    # OpenSSL would otherwise prompt on the terminal, and a server would hang at start-up
    with pytest.raises(ValueError, match=r"is encrypted; set runtime\.upstream_client_key_password"):
        UpstreamRuntime(upstream_url="https://upstream.test/v1", upstream_client_cert=files["cert"]["good"],
                        upstream_client_key=files["key"]["encrypted"])


def test_a_plain_http_upstream_without_tls_options_builds_no_context():
    assert UpstreamRuntime(upstream_url="http://upstream.test/v1").ssl_context is None
    assert UpstreamRuntime(upstream_url="https://upstream.test/v1").ssl_context is not None


# ---------------------------------------------------------------------- reef serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("options,expected", [
    ({"upstream_ca_bundle": ("ca", "missing")}, "runtime.upstream_ca_bundle: there is no file or directory at "),
    ({"upstream_client_cert": ("cert", "good")},
     "runtime.upstream_client_cert is set but runtime.upstream_client_key is not"),
    ({"upstream_client_cert": ("cert", "good"), "upstream_client_key": ("key", "garbage")},
     "garbage.pem cannot be loaded: the file is not a PEM private key"),
    ({"upstream_client_cert": ("cert", "good"), "upstream_client_key": ("key", "encrypted")},
     "client-encrypted.key is encrypted; set runtime.upstream_client_key_password"),
], ids=["missing-ca", "cert-without-key", "garbage-key", "encrypted-key-without-password"])
def test_reef_serve_reports_bad_tls_options_in_one_line(tmp_path, files, options, expected):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    overrides = [f"runtime.{option}={files[group][kind]}" for option, (group, kind) in options.items()]
    result = subprocess.run([sys.executable, "-m", "reef_core", "serve", f"server.state_dir={tmp_path / 'state'}",
                             f"server.port={_free_port()}", "runtime.upstream_url=https://127.0.0.1:9/v1", *overrides],
                            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
