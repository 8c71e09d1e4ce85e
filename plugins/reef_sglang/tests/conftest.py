from __future__ import annotations

import pytest
from fake_engine import FakeEngine, ServerThread


@pytest.fixture(params=["sglang", "vllm"])
def engine(request):
    fake = FakeEngine(request.param)
    with ServerThread(fake.app) as url:
        fake.url = url
        yield fake
    fake.gate.set()
