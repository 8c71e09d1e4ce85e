"""The garbage collector is tuned once the kernel has started (``server.gc_young_threshold``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reef_core.config import ServerSettings

_PROBE = textwrap.dedent("""
    import gc, json, sys
    from reef_core.serve.gc_tuning import tune_for_serving
    before = gc.get_threshold()
    tune_for_serving(json.loads(sys.argv[1]))
    print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
""")


@pytest.mark.parametrize("threshold", [20_000, None])
def test_start_up_objects_are_frozen_and_the_young_threshold_set(threshold):
    import json

    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(threshold)], capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out)
    assert got["frozen"] > 10_000  # reef_core and its libraries, imported
    expected = got["before"][0] if threshold is None else threshold
    assert got["after"] == [expected, *got["before"][1:]]


def test_the_setting_defaults_and_bounds():
    assert ServerSettings().gc_young_threshold == 20_000
    assert ServerSettings(gc_young_threshold=None).gc_young_threshold is None
    with pytest.raises(ValueError):
        ServerSettings(gc_young_threshold=10)


def test_reef_serve_tunes_after_the_kernel_starts(monkeypatch):
    from reef_core.serve import runner

    calls = []
    monkeypatch.setattr(runner, "tune_for_serving", lambda value: calls.append(value))

    class Kernel:
        started = False
        learning = None  # no learning loop: the start-up notes have nothing to say
        settings = type("S", (), {"server": ServerSettings(gc_young_threshold=1234)})()

        async def start(self):
            calls.append("start")
            self.started = True

        async def stop(self):
            self.started = False

    import asyncio

    import uvicorn

    async def no_serve(self, sockets=None):  # noqa: ANN001 - stands in for uvicorn's serving
        calls.append("serve")

    monkeypatch.setattr(uvicorn.Server, "serve", no_serve)
    server = runner._KernelFirstServer(uvicorn.Config(app=None), Kernel(), None)
    asyncio.run(server.serve())
    assert calls == ["start", 1234, "serve"]
