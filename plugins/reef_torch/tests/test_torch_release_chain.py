"""LoRA releases through the whole loop on the local runtime.

A weight recipe proposes an adapter; ``task_suite`` runs candidate and serving release on the
runtime (the candidate's adapter loads for its evaluation calls alone); the git chain publishes
it (LFS for the safetensors); serving hot-swaps while requests keep coming; rollback through
the HTTP route republishes the earlier adapter and restores its behaviour.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from reef_core import Candidate
from reef_train.testing import train_word_adapter

testing = pytest.importorskip("reef_core.testing")

PROMPTS = ["hello", "hi", "what?", "say something", "tell me"]
ADMIN = [{"token": "adm", "role": "admin"}]


class WordAdapterRecipe:
    """Test recipe: proposes the next prepared adapter (a real PEFT dir) as a weight update."""

    update_target = "adapter"
    filters = ("scored",)
    default_evaluator = "task_suite"

    def __init__(self, adapters: list[str], batch_size: int = 1):
        self.adapters = [Path(a) for a in adapters]
        self.batch_size = batch_size
        self.proposed = 0

    def propose(self, batch, current_artifact, ctx):
        artifact = ctx.new_artifact()
        shutil.rmtree(artifact / "adapter", ignore_errors=True)
        shutil.copytree(self.adapters[self.proposed % len(self.adapters)], artifact / "adapter")
        self.proposed += 1
        return Candidate(scenario=ctx.scenario, recipe=ctx.recipe, artifact_dir=artifact, summary="word adapter")


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chain-adapters")
    return {w: train_word_adapter(tiny_model_dir, root / w, w, PROMPTS, steps=80) for w in ("banana", "cherry")}


def _ask(client, text="hello", scenario="default"):
    r = client.post("/v1/chat/completions", headers={"x-reef-scenario": scenario},
                    json={"messages": [{"role": "user", "content": text}], "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], r.headers["x-reef-agent-record-id"]


def _grow(client, scenario: str = "default") -> dict:
    _, receipt = _ask(client, scenario=scenario)
    r = client.post("/reef/report", json={"score": 0.0, "references": [receipt]}, headers={"x-reef-scenario": scenario})
    assert r.status_code == 200, r.text
    r = client.post(f"/reef/scenarios/{scenario}/grow", timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_adapter_release_evaluated_published_swapped_and_rolled_back(tiny_model_dir, adapters, tmp_path):
    tasks = "[" + ",".join(f"{{prompt: '{p}', expected: banana}}" for p in PROMPTS[:3]) + "]"
    overrides = [
        "runtime=local", f"runtime.model={tiny_model_dir}", "runtime.device=cpu", "runtime.max_new_tokens_default=6",
        "recipe.name=word_adapter", f"+recipe.adapters=[{adapters['banana']},{adapters['cherry']}]",
        "evaluator=task_suite", f"evaluator.tasks={tasks}", "evaluator.grader=contains",
        "+evaluator.params.temperature=0", "+evaluator.params.max_tokens=6",
        "+scenarios.free.evaluator=always",
        # growth only on request: an automatic step a report wakes would answer the test's grow busy
        "loop.enabled=false",
    ]
    with testing.registered("recipe", "word_adapter", WordAdapterRecipe), \
            testing.ReefServer(tmp_path / "state", overrides, tokens=ADMIN, token="adm") as reef:
        client = reef.client(timeout=120)
        base, _ = _ask(client)
        assert "banana" not in base

        # Requests keep flowing while the candidate is evaluated, published and swapped in.
        stop, seen, errors = threading.Event(), [], []

        def load() -> None:
            with reef.client(timeout=120) as c:
                while not stop.is_set():
                    try:
                        seen.append(_ask(c, "hi"))
                    except AssertionError as exc:  # collected and asserted below
                        errors.append(exc)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            first = _grow(client)
            assert first["outcome"] == "published", first
            banana_release = first["release_id"]
            answer, _ = _ask(client)
            while len(seen) < 3:  # a few requests after the swap too
                stop.wait(0.05)
        finally:
            stop.set()
            loader.join()
        assert errors == [] and seen
        assert answer == "banana"
        for _, receipt in seen:  # every record names the adapter version it ran on
            rec = reef.store.get_record(receipt)
            expected = f"default@{rec.release_id}" if rec.release_id else None
            assert rec.adapter == expected and rec.status == "ok"

        # The candidate's task scores: it won on every task against the base it replaced.
        candidates = client.get("/reef/scenarios/default/candidates").json()["candidates"]
        row = next(c for c in candidates if c["release_id"] == banana_release)
        assert row["evaluation"]["candidate_scores"] == [1.0, 1.0, 1.0]
        assert row["evaluation"]["current_scores"] == [0.0, 0.0, 0.0]

        # Another scenario is untouched and served side by side on the base model.
        other, other_receipt = _ask(client, scenario="other")
        assert other == base and reef.store.get_record(other_receipt).adapter is None

        # The next candidate (cherry) loses the banana suite: rejected, serving unchanged.
        second = _grow(client)
        assert second["outcome"] == "rejected", second
        assert _ask(client)[0] == "banana"

        # Where every candidate is selected, cherry replaces banana; rollback restores banana.
        free_banana = _grow(client, "free")["release_id"]
        assert _grow(client, "free")["outcome"] == "published"
        assert _ask(client, scenario="free")[0] == "cherry"
        assert _ask(client)[0] == "banana"  # scenarios keep their own adapters
        r = client.post("/reef/scenarios/free/rollback", json={"release_id": free_banana})
        assert r.status_code == 200, r.text
        answer, receipt = _ask(client, scenario="free")
        assert answer == "banana"
        rows = client.get("/reef/scenarios/free/releases").json()["releases"]
        assert [x["operation"] for x in rows] == ["rollback", "train", "train"]
        assert rows[0]["content_hash"] == rows[2]["content_hash"] != rows[1]["content_hash"]
        assert reef.store.get_record(receipt).adapter == f"free@{rows[0]['release_id']}"
