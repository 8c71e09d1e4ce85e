"""The plugin contracts: registration checks derived from them, duck-typed plugins, and the
built-in plugins passing the contract kits that plugin authors use."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import reef_core
from reef_core import contracts
from reef_core.builtins.basic import BasicRecipe
from reef_core.builtins.evaluators import AlwaysEvaluator, TaskSuiteEvaluator, ThresholdEvaluator
from reef_core.builtins.feedback_rules import FeedbackRulesRecipe
from reef_core.builtins.filters import DedupFilter, FreshnessFilter, ScoredFilter, ScoreWindowFilter, SessionFilter
from reef_core.builtins.git_store import GitArtifactStore
from reef_core.builtins.harness_files import FilesAdapter
from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.commit.tasks import BUILTIN_GRADERS
from reef_core.plugins import get_plugins
from reef_core.protocols import KINDS, conform, missing_members, unwrap
from reef_core.store import RecordStore
from reef_core.testing import (
    EchoRuntime,
    FakeUpstream,
    check_artifact_store,
    check_evaluator,
    check_grader,
    check_harness_adapter,
    check_recipe,
    check_record_filter,
    check_runtime,
    synthetic_batch,
)

TASKS = [{"id": "q", "prompt": "Say Paris", "expected": "Paris"}]


def test_every_kind_has_a_contract_and_the_checks_come_from_it():
    assert set(KINDS) == set(contracts.CONTRACTS)
    assert KINDS["recipe"] == {"methods": ("propose",),
                               "attributes": ("update_target", "filters", "batch_size", "default_evaluator")}
    assert KINDS["artifact_store"]["methods"] == ("head", "history", "materialize", "publish", "scenarios")
    assert KINDS["runtime"]["methods"] == ("complete", "stream")
    assert KINDS["grader"]["methods"] == ("__call__",)


def test_builtins_subclass_their_contracts():
    plugins = get_plugins()
    for kind, entries in plugins.registry.items():
        for name, reg in entries.items():
            if not reg.plugin.startswith("reef_core."):
                continue
            if kind == "grader":
                assert isinstance(reg.obj, contracts.Grader), name
            else:
                assert issubclass(reg.obj, contracts.CONTRACTS[kind]), f"{kind} {name}"


def test_an_abstract_method_left_unimplemented_is_missing():
    class Half(contracts.Recipe):
        update_target, filters, batch_size, default_evaluator = "none", (), 0, "always"

    assert missing_members("recipe", Half, attributes=False) == ["propose"]


def test_half_a_capability_is_missing_its_other_methods_at_registration():
    class Serves(contracts.Runtime):
        async def complete(self, call):
            return {}

        async def stream(self, call):
            yield {}

    class HalfTrainable(Serves):
        def base_model(self):
            raise NotImplementedError

    class Trainable(HalfTrainable):
        def trainable_problem(self):
            return None

        def adapter_of(self, release):
            return None

    assert missing_members("runtime", Serves, attributes=False) == []  # no capability: fine
    assert missing_members("runtime", HalfTrainable, attributes=False) == [
        "adapter_of (of TrainableBase)", "trainable_problem (of TrainableBase)"]
    assert missing_members("runtime", Trainable, attributes=False) == []


class DuckStore:
    """An artifact store that does not subclass the contract (its required members only)."""

    def __init__(self):
        self.releases = {}

    def scenarios(self):
        return ["s"]

    def head(self, scenario):
        return None

    def history(self, scenario):
        return []

    def publish(self, scenario, artifact_dir, manifest, *, expected_head):
        raise NotImplementedError

    def materialize(self, scenario, commit, dest):
        raise NotImplementedError


def test_duck_typed_objects_get_the_contract_defaults():
    duck = DuckStore()
    store = conform("artifact_store", duck)
    assert isinstance(store, contracts.ArtifactStore) and unwrap(store) is duck
    assert store.heads() == {} and store.diff(None, "c") is None
    store.extra = 1  # attributes go to the wrapped object
    assert duck.extra == 1 and store.releases == {}
    assert conform("artifact_store", store) is store
    with pytest.raises(reef_core.NotFoundError):
        store.read_manifest("c")

    class DuckRuntime:
        dialect = "openai"

        async def complete(self, call):
            return {"choices": [{"message": {"content": "x"}}]}

        async def stream(self, call):
            yield {"n": 1}
            yield {"n": 2}

    runtime = conform("runtime", DuckRuntime())
    assert runtime.default_max_tokens == 4096 and runtime.config_problem() is None and runtime.models() == []

    async def batches():
        return [b async for b in runtime.stream_batches(None)]

    assert asyncio.run(batches()) == [[{"n": 1}], [{"n": 2}]]


def test_subclasses_are_not_wrapped():
    recipe = BasicRecipe()
    assert conform("recipe", recipe) is recipe


def test_runtime_stays_importable_from_its_old_module():
    from reef_core.runtime import Runtime

    assert Runtime is contracts.Runtime is reef_core.Runtime


def test_every_contract_member_is_typed_and_documented():
    for contract in contracts.CONTRACTS.values():
        for name, member in vars(contract).items():
            if name.startswith("_") and name != "__call__" or not callable(member):
                continue
            assert member.__doc__, f"{contract.__name__}.{name} has no docstring"
            sig = inspect.signature(member)
            assert "return" in member.__annotations__, f"{contract.__name__}.{name} has no return type"
            for p in list(sig.parameters.values())[1:]:
                assert p.annotation is not inspect.Parameter.empty, f"{contract.__name__}.{name}({p.name})"


def test_reef_core_exports_what_a_plugin_sees():
    for name in ("Recipe", "Evaluator", "RecordFilter", "ArtifactStore", "HarnessAdapter", "Grader", "Runtime",
                 "Batch", "Experience", "ExperienceRecord", "RecipeContext", "EvalContext", "FilterContext",
                 "Candidate", "Evaluation", "Decision", "HarnessBundle", "ActiveRelease", "StoredRelease",
                 "PublishConflict", "ConfigError", "hookimpl"):
        assert name in reef_core.__all__ and hasattr(reef_core, name), name


# --------------------------------------------------------------------------- the built-ins pass the kits


@pytest.mark.parametrize(("recipe", "rule"), [
    (BasicRecipe(), None),
    (FeedbackRulesRecipe(), "Always show the working before the answer."),
    (FeedbackRulesRecipe(proposer="runtime"), "Keep answers short."),  # what the kit's model answers
], ids=["basic", "feedback_rules", "feedback_rules-runtime-proposer"])
def test_builtin_recipes_pass_the_kit(recipe, rule, tmp_path):
    first, second = check_recipe(recipe, tmp_path)
    if rule is None:
        assert first is None and second is None
    else:
        assert rule in (first.artifact_dir / "harness" / "rules.md").read_text()
        assert second is None  # the serving release (the first candidate) already has every rule of the batch


@pytest.mark.parametrize("evaluator", [AlwaysEvaluator(), TaskSuiteEvaluator(tasks=TASKS),
                                       ThresholdEvaluator(tasks=TASKS)], ids=["always", "task_suite", "threshold"])
def test_builtin_evaluators_pass_the_kit(evaluator, tmp_path):
    evaluation, decision = check_evaluator(evaluator, tmp_path)
    if not isinstance(evaluator, AlwaysEvaluator):
        assert evaluation.candidate_scores == [1.0] and evaluation.current_scores == [1.0]  # echo says Paris
        # a tie: task_suite needs wins - losses > margin, threshold a mean at least the current one
        assert decision.outcome == ("select" if isinstance(evaluator, ThresholdEvaluator) else "reject")


@pytest.mark.parametrize("name", sorted(BUILTIN_GRADERS))
def test_builtin_graders_pass_the_kit(name):
    assert check_grader(get_plugins().get("grader", name)) == (1.0, 0.0)


@pytest.mark.parametrize("record_filter", [ScoredFilter(), ScoreWindowFilter(max=0.5), DedupFilter(),
                                           FreshnessFilter(), SessionFilter()],
                         ids=["scored", "score_window", "dedup", "freshness", "session"])
def test_builtin_filters_pass_the_kit(record_filter, tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        kept = check_record_filter(record_filter, store=store)
    finally:
        store.close()
    if isinstance(record_filter, ScoredFilter):
        assert [e.score for e in kept] == [1.0, 0.0, 0.9]
    if isinstance(record_filter, ScoreWindowFilter):
        assert [e.score for e in kept] == [0.0]


def test_files_harness_adapter_passes_the_kit(tmp_path):
    text = check_harness_adapter(FilesAdapter(), tmp_path)
    assert text.startswith("#!/bin/sh") and "skills/units/SKILL.md" in text


def test_git_artifact_store_passes_the_kit(tmp_path):
    history = check_artifact_store(lambda: GitArtifactStore(state_dir=tmp_path / "state"), tmp_path)
    assert [s.sequence for s in history] == [2, 1]


def test_echo_runtime_passes_the_kit():
    out = check_runtime(EchoRuntime())
    assert out["response"]["choices"][0]["message"]["content"] == "Say hi."


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_upstream_runtime_passes_the_kit(dialect):
    with FakeUpstream(dialect) as up:
        out = check_runtime(UpstreamRuntime(upstream_url=up.url, dialect=dialect))
    assert len(out["events"]) >= 2 and out["batches"]


def test_a_responses_upstream_runtime_passes_the_kit():
    from reef_core.testing import FakeResponsesUpstream

    with FakeResponsesUpstream() as up:
        out = check_runtime(UpstreamRuntime(upstream_url=up.url, dialect="responses"))
    assert out["response"]["output"][-1]["content"][0]["text"] == "echo: Say hi."
    assert out["events"][-1]["type"] == "response.completed" and up.requests[0]["max_output_tokens"] == 16


def test_kits_catch_a_broken_recipe(tmp_path):
    class WrongReturn(contracts.Recipe):
        update_target, filters, batch_size, default_evaluator = "harness", (), 1, "always"

        def propose(self, batch, current, ctx):
            return ctx.new_artifact()  # a Path, not a Candidate

    with pytest.raises(AssertionError, match="not a Candidate"):
        check_recipe(WrongReturn(), tmp_path)


def test_synthetic_batch_is_varied():
    scores = [e.score for e in synthetic_batch()]
    assert scores == [1.0, 0.0, 0.9, None]
