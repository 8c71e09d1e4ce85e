"""``reef serve`` start-up failures: one ``Error: ...`` line on stderr naming what failed, exit 2.

A runtime that cannot be built or started, an extension whose ``on_start`` fails, or a plugin
that breaks while loading must not print a traceback (only ``server.log_level=debug`` does).
The failing runtimes come from a plugin installed the way pip would (an entry point on
``PYTHONPATH``), selected with ``runtime=<name>`` through the plugin's own config group.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reef_core import hookimpl
from reef_core.errors import StartupError
from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.runtime import Runtime
from reef_core.testing import reef_settings

PLUGIN = """
    from pathlib import Path

    from reef_core import hookimpl
    from reef_core.errors import StartupError
    from reef_core.runtime import Runtime


    class _Base(Runtime):
        def __init__(self, how: str = "boom"):
            self.how = how

        async def complete(self, call):
            raise AssertionError("never serves")

        async def stream(self, call):
            raise AssertionError("never serves")
            yield {}


    class FailsInStart(_Base):
        async def start(self):
            if self.how == "explained":
                raise StartupError("the engine needs a licence file; put it in /etc/engine/licence")
            raise RuntimeError("engine on fire\\nsecond line of the message")


    class FailsInInit(_Base):
        def __init__(self, how: str = "boom"):
            raise OSError(28, "No space left on device")


    @hookimpl
    def register_runtimes(register):
        register("fails_in_start", FailsInStart)
        register("fails_in_init", FailsInInit)


    @hookimpl
    def reef_config_dir():
        return str(Path(__file__).resolve().parent / "startup_conf")
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory holding the ``startup_failures`` plugin as an installed distribution."""
    site = tmp_path_factory.mktemp("site")
    (site / "startup_failures.py").write_text(textwrap.dedent(PLUGIN))
    conf = site / "startup_conf" / "runtime"
    conf.mkdir(parents=True)
    for name in ("fails_in_start", "fails_in_init"):
        (conf / f"{name}.yaml").write_text(f"name: {name}\nhow: boom\n")
    info = site / "startup_failures-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: startup_failures\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reef]\nstartup_failures = startup_failures\n")
    (info / "RECORD").write_text("")
    return site


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path: Path, *overrides: str, site: Path | None = None, plugins: str = "",
           code: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["REEF_PLUGINS"] = plugins
    if site is not None:
        env["PYTHONPATH"] = str(site)
    launcher = ["-c", code] if code else ["-m", "reef_core"]
    return subprocess.run([sys.executable, *launcher, "serve", f"server.state_dir={tmp_path / 'state'}",
                           f"server.port={_free_port()}", *overrides],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_runtime_failing_in_start_is_one_line(tmp_path, site):
    line = _one_error_line(_serve(tmp_path, "runtime=fails_in_start", site=site, plugins="startup_failures"))
    assert line == ("Error: runtime 'fails_in_start' failed to start: RuntimeError: engine on fire second line of "
                    "the message (run with server.log_level=debug for the traceback)")


def test_runtime_explaining_its_failure_is_quoted_as_it_is(tmp_path, site):
    line = _one_error_line(_serve(tmp_path, "runtime=fails_in_start", "runtime.how=explained", site=site,
                                  plugins="startup_failures"))
    assert line == ("Error: runtime 'fails_in_start' failed to start: the engine needs a licence file; "
                    "put it in /etc/engine/licence")


def test_runtime_failing_in_its_constructor_is_one_line(tmp_path, site):
    line = _one_error_line(_serve(tmp_path, "runtime=fails_in_init", site=site, plugins="startup_failures"))
    assert line.startswith("Error: runtime 'fails_in_init' could not be built: OSError: ")
    assert "No space left on device" in line


def test_debug_log_level_shows_the_traceback(tmp_path, site):
    result = _serve(tmp_path, "runtime=fails_in_start", "server.log_level=debug", site=site,
                    plugins="startup_failures")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "engine on fire" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: runtime 'fails_in_start' failed to start")


def test_plugin_failing_while_loading_is_one_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_conf.py").write_text(textwrap.dedent("""
        from reef_core import hookimpl

        @hookimpl
        def reef_config_dir():
            raise KeyError("REEF_BROKEN_HOME")
        """))
    info = site / "broken_conf-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken_conf\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reef]\nbroken_conf = broken_conf\n")
    line = _one_error_line(_serve(tmp_path, site=site, plugins="broken_conf"))
    assert "KeyError" in line and "REEF_BROKEN_HOME" in line


def test_no_token_warning_is_not_printed_when_start_fails(tmp_path, site):
    # The warning about binding without a token concerns a server that serves; one that does
    # not start prints only its error.
    result = _serve(tmp_path, "runtime=fails_in_start", "server.host=0.0.0.0", site=site,
                    plugins="startup_failures")
    _one_error_line(result)


# ---------------------------------------------------------------------- in process


class _Quiet(Runtime):
    def __init__(self) -> None:
        self.started = self.closed = False

    async def start(self) -> None:
        self.started = True

    async def complete(self, call):
        raise AssertionError("never serves")

    async def stream(self, call):
        raise AssertionError("never serves")
        yield {}

    async def aclose(self) -> None:
        self.closed = True


def test_plugin_failing_on_start_names_itself_and_stops_the_runtime(tmp_path):
    runtime = _Quiet()
    reef = Reef(reef_settings(tmp_path, ["runtime.upstream_url=http://127.0.0.1:9/v1"]), get_plugins(),
                runtime=runtime)
    stopped = []

    class SearchIndex:
        @hookimpl
        async def startup(self, reef) -> None:
            raise ConnectionRefusedError("search index at 127.0.0.1:9200 refused the connection")

        @hookimpl
        async def shutdown(self, reef) -> None:
            stopped.append(reef)

    reef.register(SearchIndex(), name="search-index")
    with pytest.raises(StartupError) as err:
        asyncio.run(reef.start())
    message = str(err.value)
    assert message.startswith("plugin 'search-index' failed to start: ConnectionRefusedError: search index"), message
    assert isinstance(err.value.__cause__, ConnectionRefusedError)
    assert runtime.started and runtime.closed and stopped == [reef] and not reef.started
    assert err.value.exit_code == 2
    reef.store.close()


def test_a_postgresql_store_without_its_driver_is_one_line_naming_the_extra(tmp_path):
    code = "import sys; sys.modules['psycopg'] = None; from reef_core.cli import main; main(prog_name='reef')"
    line = _one_error_line(_serve(tmp_path, "record_store=postgres",
                                  "record_store.url=postgresql://reef:secret@127.0.0.1:9/reef", code=code))
    assert line.endswith("could not be opened: the database driver 'psycopg' is not installed: "
                         "pip install 'reef-core[postgres]'")
    assert "secret" not in line


def test_a_port_in_use_stops_start_up_before_it_touches_the_state(tmp_path):
    """One worker as several: the address is tried before the kernel starts, so the record of the
    server already on the port (served-config.json) stays as it was."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = _serve(tmp_path, f"server.port={port}", "runtime.upstream_url=http://127.0.0.1:9/v1")
    assert _one_error_line(result) == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert not (tmp_path / "state").exists()
    bad_host = _serve(tmp_path, "server.host=999.1.1.1", "auth.tokens=[{token: abcdefgh, role: admin}]",
                      "runtime.upstream_url=http://127.0.0.1:9/v1")
    assert _one_error_line(bad_host).startswith("Error: cannot listen on 999.1.1.1:")
