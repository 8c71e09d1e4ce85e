#!/usr/bin/env python3
"""``uv pip install ARGS`` into the environment of the Python running this, told what pip is told.

scripts/setup.sh installs with uv when it can: the same packages as pip in a third of the time
(Reef with its plugins, torch and the test extras into a new virtualenv on 2 cores: 9.5 s with
uv's cache empty, against 28 s for pip with its cache filled). uv reads none of pip's
configuration, so this asks pip for the options ``pip install`` would run with (its
configuration files and ``PIP_*`` variables, merged as pip merges them) and hands uv the ones
that decide what is installed from where: the index, the extra indexes, find-links,
constraints, trusted hosts, the CA bundle and a proxy. uv then considers every index for every
package, as pip does (``--index-strategy unsafe-best-match``).

When pip's configuration sets anything else that uv would not be told (``--pre``, binary-only
rules, a client certificate, ...), or pip cannot say, this exits 3 without running uv, with one
line saying why, and setup.sh installs with pip. ``--check`` only makes that decision;
``--options`` prints uv, its options and its environment as JSON (``{"uv": path, "args": [...],
"env": {...}}``) for a caller that runs uv itself (the wheel tests): importing pip changes what
``import distutils`` finds in the importing process (setuptools' shim stands down for pip), so a
caller asks this script in a process of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

#: options that change how pip talks or prints, not what it installs
HARMLESS = {"help", "debug_mode", "verbose", "quiet", "log", "no_input", "retries", "resume_retries", "timeout",
            "cache_dir", "disable_pip_version_check", "no_color", "no_python_version_warning", "progress_bar",
            "root_user_action", "src_dir", "keyring_provider", "exists_action", "features_enabled",
            "deprecated_features_enabled", "warn_script_location", "warn_about_conflicts", "compile", "no_clean",
            "require_venv", "isolated_mode"}
#: options handed to uv (below)
HANDED = {"index_url", "extra_index_urls", "find_links", "constraints", "no_index", "trusted_hosts", "cert", "proxy"}


def _pip_options(env: dict[str, str]) -> dict[str, object]:
    """``pip install``'s options with no arguments given, under ``env``, parsed by pip itself."""
    from pip._internal.commands import create_command

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        options, _ = create_command("install").parse_args([])
        return dict(vars(options))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def uv_arguments() -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's configuration; ValueError naming what uv would not be told."""
    try:
        configured = _pip_options(dict(os.environ))
        bare = _pip_options({**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
                             "PIP_CONFIG_FILE": os.devnull})
    except Exception as exc:  # pip's internals moved: not ours to guess at
        raise ValueError(f"pip could not say its options ({type(exc).__name__}: {exc})") from exc
    differs = sorted(k for k in configured if configured[k] != bare.get(k) and k not in HARMLESS | HANDED)
    if differs:
        raise ValueError("pip's configuration sets " + ", ".join(differs))
    args = ["--index-strategy", "unsafe-best-match"]
    if configured["no_index"]:
        args.append("--no-index")
    else:
        args += ["--index-url", str(configured["index_url"])]
        for url in configured["extra_index_urls"] or []:
            args += ["--extra-index-url", url]
    for place in configured["find_links"] or []:
        args += ["--find-links", place]
    for path in configured["constraints"] or []:
        args += ["--constraint", path]
    for host in configured["trusted_hosts"] or []:
        args += ["--allow-insecure-host", host]
    env: dict[str, str] = {}
    if configured["cert"]:
        env["SSL_CERT_FILE"] = str(configured["cert"])
    if configured["proxy"]:
        env.update(HTTP_PROXY=str(configured["proxy"]), HTTPS_PROXY=str(configured["proxy"]))
    return args, env


def main(argv: list[str]) -> int:
    uv = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    if uv is None:
        print("uv-install: no uv next to this Python nor on PATH", file=sys.stderr)
        return 3
    try:
        args, env = uv_arguments()
    except ValueError as exc:
        print(f"uv-install: {exc}; installing with pip", file=sys.stderr)
        return 3
    if argv[:1] == ["--check"]:
        return 0
    if argv[:1] == ["--options"]:
        print(json.dumps({"uv": uv, "args": args, "env": env}))
        return 0
    command = [uv, "pip", "install", "--python", sys.executable, *args, *argv]
    return subprocess.run(command, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
