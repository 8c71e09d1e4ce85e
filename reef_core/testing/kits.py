"""Contract kits: one call per plugin kind that checks an object against its contract.

A plugin's own tests call the kit for what it registers, e.g.::

    from reef_core.testing import check_recipe

    def test_my_recipe_keeps_the_contract(tmp_path):
        check_recipe(MyRecipe(), tmp_path)

Each kit fails with an ``AssertionError`` naming the broken promise, and returns what it
observed (candidates, evaluations, rendered text, ...) so a test can assert more. The kits
need no network and no database unless the object under test does (pass ``store=``, or a
runtime pointed at a ``FakeUpstream``). The built-in plugins pass them (tests/test_contracts.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..commit.artifacts import MANIFEST_FORMAT, StoredRelease, content_hash, describe
from ..commit.chain import stage_candidate
from ..commit.gate import EvalContext
from ..commit.harness import harness_bundle
from ..contracts import Runtime, ServedBase, TrainableBase, require_trainable, trainable_base
from ..errors import ConfigError, PublishConflict
from ..grow.context import RecipeContext
from ..grow.progress import LogProgress
from ..observe import Batch, Experience, ExperienceRecord, FilterContext, parse_filter_spec
from ..protocols import conform, missing_members, unwrap
from ..types import ActiveRelease, Candidate, Decision, Evaluation, InferenceCall

log = logging.getLogger("reef.kit")

SCENARIO = "kit"
_UPDATE_TARGETS = ("harness", "adapter", "weights", "none")


def _conforms(kind: str, obj: Any) -> Any:
    missing = missing_members(kind, obj)
    assert not missing, f"{kind} {obj!r} lacks required member(s): {', '.join(missing)}"
    return conform(kind, obj)


# --------------------------------------------------------------------------- synthetic values


def synthetic_batch(scenario: str = SCENARIO) -> Batch:
    """Four experiences, oldest first: well and badly scored answers, with and without feedback,
    one unscored; each quotes one OpenAI-dialect exchange."""
    rows = [
        (1.0, None, "What is 2+2?", "4"),
        (0.0, "Always show the working before the answer", "What is 17*3?", "51"),
        (0.9, {"note": "good, but cite the rule"}, "Is 7 prime?", "Yes."),
        (None, "unscored remark", "Hello?", "Hi."),
    ]
    items = []
    for i, (score, feedback, question, answer) in enumerate(rows):
        record = ExperienceRecord(
            id=f"rec_kit{i}", scenario=scenario, session=None, release_id=None, created_at=None, status="ok",
            model="kit-model", route="chat.completions",
            request={"model": "kit-model", "messages": [{"role": "user", "content": question}]},
            response={"choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                   "finish_reason": "stop"}]},
            seq=i + 1)
        items.append(Experience(report_id=f"rpt_kit{i}", scenario=scenario, score=score, feedback=feedback,
                                metadata={}, created_at=datetime.now(timezone.utc), records=(record,)))
    return Batch(scenario, items)


def synthetic_release(root: Path, scenario: str = SCENARIO, release_id: str = "rel_kit") -> ActiveRelease:
    """A materialized harness release under ``root``: system prompt, rules and one skill."""
    harness = Path(root) / "harness"
    (harness / "skills" / "units").mkdir(parents=True, exist_ok=True)
    (harness / "system.md").write_text("You answer briefly.\n")
    (harness / "rules.md").write_text("- Cite sources.\n")
    (harness / "skills" / "units" / "SKILL.md").write_text("---\nname: units\ndescription: convert units\n---\n")
    return ActiveRelease(scenario=scenario, release_id=release_id, content_hash=content_hash(root), path=Path(root))


class _OfflineModel:
    """What ``RecipeContext.complete`` calls in a kit: answers every body with ``answer``."""

    def __init__(self, answer: str):
        self.answer = answer

    def complete(self, body: dict[str, Any], release: ActiveRelease | None, *, timeout_s: float | None = None):
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer},
                             "finish_reason": "stop"}]}


def recipe_context(scratch_dir: Path, current: ActiveRelease | None, *, recipe: str = "kit", runtime: Any = None,
                   store: Any = None, settings: Any = None, answer: str = "Keep answers short.") -> RecipeContext:
    """A ``RecipeContext`` without a server: ``complete`` answers ``answer``; ``runtime`` (default
    ``EchoRuntime``), ``store`` and ``settings`` (default: the default config) as given."""
    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    if settings is None:
        from .reef_server import reef_settings

        settings = reef_settings(Path(scratch_dir) / "state")
    logger = logging.getLogger(f"reef.kit.{recipe}")
    runtime = conform("runtime", runtime if runtime is not None else EchoRuntime())
    return RecipeContext(scenario=current.scenario if current else SCENARIO, recipe=recipe, runtime=runtime,
                         store=store, scratch_dir=Path(scratch_dir), progress=LogProgress(logger), log=logger,
                         current=current, settings=settings, _model=_OfflineModel(answer))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- recipes


def _check_candidate(proposed: Any, where: str, dest: Path) -> Candidate | None:
    assert proposed is None or isinstance(proposed, Candidate), \
        f"propose {where} returned {type(proposed).__name__}, not a Candidate or None"
    if proposed is not None:
        assert Path(proposed.artifact_dir).is_dir(), f"propose {where}: artifact_dir {proposed.artifact_dir} is no directory"
        stage_candidate(Path(proposed.artifact_dir), dest)  # plain files with servable names, a valid harness
    return proposed


def check_recipe(recipe: Any, tmp_path: Path, *, batch: Batch | None = None,
                 context: Callable[[Path, ActiveRelease | None], RecipeContext] | None = None,
                 ) -> tuple[Candidate | None, Candidate | None]:
    """Run ``recipe.propose`` without a serving release, then with one; return both results.

    Checks the required attributes, that each result is a Candidate (whose artifact can be
    staged and served) or None, and that propose leaves the serving release's files alone. The
    serving release of the second call is the first candidate's artifact when there is one,
    else ``synthetic_release``. ``context(scratch_dir, current)`` builds ``ctx`` (default
    ``recipe_context``); ``batch`` defaults to ``synthetic_batch()``.
    """
    recipe = _conforms("recipe", recipe)
    assert recipe.update_target in _UPDATE_TARGETS, f"update_target {recipe.update_target!r} is not one of {_UPDATE_TARGETS}"
    for spec in recipe.filters or ():
        parse_filter_spec(spec)
    assert isinstance(recipe.batch_size, int) and recipe.batch_size >= 0, f"batch_size {recipe.batch_size!r}"
    assert isinstance(recipe.max_batches, int) and recipe.max_batches >= 1, f"max_batches {recipe.max_batches!r}"
    assert isinstance(recipe.default_evaluator, str) and recipe.default_evaluator, "default_evaluator must name one"
    batch = batch or synthetic_batch()
    make_ctx = context or recipe_context
    tmp_path = Path(tmp_path)

    first = _check_candidate(recipe.propose(batch, None, make_ctx(tmp_path / "scratch-1", None)),
                             "without a serving release", tmp_path / "staged-1")
    served = tmp_path / "serving"
    if first is not None:
        shutil.copytree(first.artifact_dir, served)
        current = ActiveRelease(scenario=batch.scenario, release_id="rel_kit_1", content_hash=content_hash(served),
                                path=served)
    else:
        current = synthetic_release(served, batch.scenario, "rel_kit_1")
    second = _check_candidate(recipe.propose(batch, current, make_ctx(tmp_path / "scratch-2", current)),
                              "with a serving release", tmp_path / "staged-2")
    assert content_hash(served) == current.content_hash, "propose changed the serving release's files"
    return first, second


# --------------------------------------------------------------------------- evaluators and graders


class EchoRuntime(Runtime):
    """A runtime for kits: answers every call with the last user message, in the OpenAI dialect."""

    def __init__(self) -> None:
        self.calls: list[InferenceCall] = []

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        self.calls.append(call)
        text = str((call.body.get("messages") or [{}])[-1].get("content", ""))
        return {"id": "kit", "object": "chat.completion", "model": call.body.get("model", "kit-model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    async def stream(self, call: InferenceCall):
        body = await self.complete(call)
        yield {"id": "kit", "object": "chat.completion.chunk", "model": body["model"],
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                            "finish_reason": "stop"}]}


class TrainableEchoRuntime(EchoRuntime):
    """``EchoRuntime`` offering ``TrainableBase`` on a local model directory (a weight recipe's
    tests: it trains on the files, answers calls by echoing). ``eos_token_ids`` are the model's."""

    def __init__(self, model_dir: Any, *, model_id: str = "tiny", eos_token_ids: tuple[int, ...] = (2,)):
        super().__init__()
        self.model_dir = Path(model_dir)
        self.model_id = model_id
        self.eos_token_ids = tuple(eos_token_ids)

    def trainable_problem(self) -> str | None:
        return None

    def base_model(self) -> ServedBase:
        return ServedBase(path=self.model_dir, model_id=self.model_id, device="cpu", dtype="float32",
                          eos_token_ids=self.eos_token_ids)

    def adapter_of(self, release: Any) -> Path | None:
        return release.adapter_dir if release is not None else None


@contextmanager
def eval_context(runtime: Any = None, *, scenario: str = SCENARIO) -> Iterator[EvalContext]:
    """An ``EvalContext`` whose runtime (default ``EchoRuntime()``) runs on an event loop in a thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="reef-kit-loop", daemon=True)
    thread.start()
    logger = logging.getLogger("reef.kit.eval")
    try:
        yield EvalContext(scenario=scenario, runtime=conform("runtime", runtime or EchoRuntime()), loop=loop,
                          apply_harness=None, log=logger, progress=LogProgress(logger), default_model="kit-model")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def check_evaluator(evaluator: Any, tmp_path: Path, *, runtime: Any = None) -> tuple[Evaluation, Decision]:
    """Evaluate a harness candidate against a serving release and decide; return both.

    Checks the result types, that the scores are finite or None, and that the decision is
    select, reject, undecided or error. ``runtime`` (default ``EchoRuntime``) answers ``ctx.complete``.
    """
    evaluator = _conforms("evaluator", evaluator)
    assert evaluator.timeout_s is None or evaluator.timeout_s > 0, f"timeout_s {evaluator.timeout_s!r}"
    tmp_path = Path(tmp_path)
    current = synthetic_release(tmp_path / "current")
    art = tmp_path / "candidate"
    shutil.copytree(current.path, art)
    (art / "harness" / "rules.md").write_text("- Cite sources.\n- Show the working.\n")
    candidate = Candidate(scenario=SCENARIO, recipe="kit", artifact_dir=art, base_release_id=current.release_id,
                          id="cand_kit")
    with eval_context(runtime) as ctx:
        evaluation = evaluator.evaluate(candidate, current, ctx)
    assert isinstance(evaluation, Evaluation), f"evaluate returned {type(evaluation).__name__}, not an Evaluation"
    for score in (*evaluation.candidate_scores, *evaluation.current_scores):
        assert score is None or (isinstance(score, (int, float)) and math.isfinite(score)), f"score {score!r}"
    evaluation.to_dict()
    decision = evaluator.decide(evaluation)
    assert isinstance(decision, Decision), f"decide returned {type(decision).__name__}, not a Decision"
    assert decision.outcome in ("select", "reject", "undecided", "error"), f"decision outcome {decision.outcome!r}"
    return evaluation, decision


def check_grader(grader: Callable[..., float], *, output: str = "Paris",
                 task: Mapping[str, Any] | None = None) -> tuple[float, float]:
    """Grade a matching and a non-matching answer of one task; both scores must be floats in [0, 1],
    the matching one at least the other. Returns (matching, non-matching)."""
    _conforms("grader", grader)
    task = dict(task or {"id": "france", "prompt": "What is the capital of France?", "expected": "Paris"})
    scores = (grader(output, task), grader("I do not know.", task))
    for s in scores:
        assert isinstance(s, (int, float)) and not isinstance(s, bool) and 0.0 <= s <= 1.0, f"grade {s!r} not in [0, 1]"
    assert scores[0] >= scores[1], f"the matching answer scored {scores[0]}, below the other's {scores[1]}"
    return float(scores[0]), float(scores[1])


# --------------------------------------------------------------------------- record filters and harness adapters


def check_record_filter(record_filter: Any, items: list[Experience] | None = None, *, store: Any = None,
                        scenario: str = SCENARIO) -> list[Experience]:
    """Apply the filter to ``items`` (default: ``synthetic_batch``'s) and return what it kept.

    Checks that it keeps a sub-sequence of the reports (in order; an item may come back
    enriched), and that it is idempotent. ``store`` is the record store in ``ctx.store``.
    """
    record_filter = _conforms("record_filter", record_filter)
    items = list(items if items is not None else synthetic_batch(scenario).items)
    ctx = FilterContext(scenario=scenario, store=store)
    kept = record_filter.apply(list(items), ctx)
    assert isinstance(kept, list) and all(isinstance(e, Experience) for e in kept), "apply must return a list of Experience"
    ids = [e.report_id for e in items]
    kept_ids = [e.report_id for e in kept]
    positions = [ids.index(i) for i in kept_ids if i in ids]
    assert len(positions) == len(kept_ids), "apply returned experience it was not given"
    assert positions == sorted(set(positions)), "apply must keep the items' order, each at most once"
    again = record_filter.apply(list(kept), ctx)
    assert [e.report_id for e in again] == kept_ids, "apply is not idempotent: applying it twice keeps less"
    return kept


def check_harness_adapter(adapter: Any, tmp_path: Path) -> str:
    """Render a synthetic harness release; return the installer text (must be non-empty)."""
    adapter = _conforms("harness_adapter", adapter)
    assert isinstance(adapter.media_type, str) and "/" in adapter.media_type, f"media_type {adapter.media_type!r}"
    bundle = harness_bundle(synthetic_release(Path(tmp_path) / "release"))
    text = adapter.render(bundle)
    assert isinstance(text, str) and text, "render must return the installer as non-empty text"
    return text


# --------------------------------------------------------------------------- artifact stores


def _manifest(scenario: str, artifact: Path, sequence: int, parent: str | None, release_id: str) -> dict[str, Any]:
    chash, sums = describe(artifact)
    return {"format": MANIFEST_FORMAT, "scenario": scenario, "release_id": release_id, "sequence": sequence,
            "parent": parent, "content_hash": chash, "files": sums, "operation": "train", "candidate_id": None,
            "evaluation": None, "created_at": datetime.now(timezone.utc).isoformat()}


def _artifact(root: Path, rules: str) -> Path:
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "rules.md").write_text(rules)
    (root / "harness" / "system.md").write_text("You help.\n")
    return root


def check_artifact_store(store_factory: Callable[[], Any], tmp_path: Path, *,
                         scenario: str = "kit/scenario one") -> list[StoredRelease]:
    """Exercise a fresh store: publish, compare-and-swap conflicts, head, heads, history,
    materialize, read_manifest, diff and scenarios, then read it back through a second
    ``store_factory()`` (which must open the same state). Returns the history, newest first."""
    tmp_path = Path(tmp_path)
    store = _conforms("artifact_store", store_factory())
    assert scenario not in store.scenarios() and store.head(scenario) is None and store.history(scenario) == [], \
        "a fresh store must have no release of the scenario"

    one = _artifact(tmp_path / "one", "- One.\n")
    first = store.publish(scenario, one, _manifest(scenario, one, 1, None, "rel_kit_1"), expected_head=None)
    assert isinstance(first, StoredRelease) and first.release_id == "rel_kit_1" and first.scenario == scenario
    assert first.manifest["content_hash"] == content_hash(one)
    two = _artifact(tmp_path / "two", "- One.\n- Two.\n")
    try:
        store.publish(scenario, two, _manifest(scenario, two, 1, None, "rel_kit_x"), expected_head=None)
    except PublishConflict:
        pass
    else:
        raise AssertionError("publishing a first release over an existing one must raise PublishConflict")
    second = store.publish(scenario, two, _manifest(scenario, two, 2, "rel_kit_1", "rel_kit_2"),
                           expected_head=first.commit)
    assert second.commit != first.commit, "each release needs its own commit"
    try:
        store.publish(scenario, one, _manifest(scenario, one, 2, "rel_kit_1", "rel_kit_y"), expected_head=first.commit)
    except PublishConflict:
        pass
    else:
        raise AssertionError("publishing with a stale expected_head must raise PublishConflict")

    for view in (store, _conforms("artifact_store", store_factory())):
        head = view.head(scenario)
        assert head is not None and head.commit == second.commit, "head must be the newest release"
        assert [s.release_id for s in view.history(scenario)] == ["rel_kit_2", "rel_kit_1"], \
            "history must list every release, newest first"
        assert scenario in view.scenarios(), "scenarios() must list a scenario with a release"
        assert view.heads().get(scenario) == second.commit, "heads() must map the scenario to its head commit"
        assert view.read_manifest(first.commit)["release_id"] == "rel_kit_1"
        dest = view.materialize(scenario, first.commit, tmp_path / f"materialized-{id(view)}")
        assert content_hash(dest) == content_hash(one), "materialize must give back the published files"
        diff = view.diff(first.commit, second.commit)
        assert diff is None or ("Two." in diff), "diff must show the change (or be None: not supported)"
    return store.history(scenario)


# --------------------------------------------------------------------------- runtimes


def check_runtime(runtime: Any, *, body: dict[str, Any] | None = None, start: bool = True) -> dict[str, Any]:
    """Start the runtime, answer ``body`` non-streamed and streamed (also as batches), activate a
    release, list models, close. ``body`` defaults to a one-question chat in the runtime's dialect.
    Returns {"response", "events", "batches", "models"} for further checks."""
    runtime = _conforms("runtime", runtime)
    assert runtime.dialect in ("openai", "anthropic", "responses"), f"dialect {runtime.dialect!r}"
    assert isinstance(runtime.default_max_tokens, int) and runtime.default_max_tokens > 0

    async def run() -> dict[str, Any]:
        if start:
            await runtime.start()
        try:
            problem = runtime.config_problem()
            assert problem is None or isinstance(problem, str), "config_problem returns a sentence or None"
            models = list(runtime.models())
            assert all(isinstance(m, str) for m in models), "models() must list names"
            default = {"input": "Say hi.", "max_output_tokens": 16} if runtime.dialect == "responses" \
                else {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 16}
            req = dict(body or default)
            if models and "model" not in req:
                req["model"] = models[0]
            call = InferenceCall(scenario=SCENARIO, record_id="rec_kit", body=req, dialect=runtime.dialect)
            response = await runtime.complete(call)
            assert isinstance(response, dict), "complete must return the response body as a dict"
            events = [e async for e in runtime.stream(InferenceCall(scenario=SCENARIO, record_id="rec_kit_s",
                                                                    body={**req, "stream": True},
                                                                    dialect=runtime.dialect))]
            assert events and all(isinstance(e, dict) for e in events), "stream must yield event dicts"
            batches = [b async for b in runtime.stream_batches(InferenceCall(
                scenario=SCENARIO, record_id="rec_kit_b", body={**req, "stream": True}, dialect=runtime.dialect))]
            assert all(isinstance(b, list) and all(isinstance(e, dict) for e in b) for b in batches), \
                "stream_batches must yield lists of event dicts"
            assert sum(len(b) for b in batches) > 0, "stream_batches yielded no event"
            await runtime.activate(ActiveRelease(scenario=SCENARIO, release_id="rel_kit", content_hash=""))
            return {"response": response, "events": events, "batches": batches, "models": models}
        finally:
            await runtime.aclose()

    return asyncio.run(run())


def check_trainable_base(runtime: Any, tmp_path: Path) -> ServedBase | None:
    """Check a runtime's ``TrainableBase`` capability (start the runtime first when its
    ``base_model()`` needs that). As configured it either has a problem sentence — then
    ``trainable_base`` is None and ``require_trainable`` and ``base_model`` raise ``ConfigError``
    with it, and the kit returns None — or describes a loadable base directory and maps releases
    to their adapter directories (None for none and for a harness-only release); the kit then
    returns that ``ServedBase``."""
    inner = unwrap(runtime)
    assert isinstance(inner, TrainableBase), \
        f"{inner!r} lacks TrainableBase's base_model(), adapter_of(release) or trainable_problem()"
    problem = inner.trainable_problem()
    if problem is not None:
        assert isinstance(problem, str) and problem.strip(), "trainable_problem() returns a sentence or None"
        assert trainable_base(runtime) is None, "trainable_base() must be None while there is a problem"
        for attempt in (lambda: require_trainable(runtime, "kit"), inner.base_model):
            try:
                attempt()
            except ConfigError as exc:
                assert problem in str(exc), f"the ConfigError must carry the problem sentence, not {exc}"
            else:
                raise AssertionError("require_trainable/base_model must raise ConfigError while there is a problem")
        return None
    assert trainable_base(runtime) is inner and require_trainable(runtime, "kit") is inner
    base = inner.base_model()
    assert isinstance(base, ServedBase), f"base_model() must return a reef_core.ServedBase, not {type(base).__name__}"
    path = Path(base.path)
    assert path.is_absolute() and (path / "config.json").is_file(), \
        f"ServedBase.path must be an absolute Hugging Face model directory, not {path}"
    assert any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")), \
        f"ServedBase.path {path} holds no tokenizer"
    assert isinstance(base.model_id, str) and base.model_id, "ServedBase.model_id must name the model"
    assert isinstance(base.device, str) and base.device, "ServedBase.device must be a device name"
    assert base.dtype is None or isinstance(base.dtype, str), "ServedBase.dtype is a name or None"
    assert isinstance(base.eos_token_ids, tuple) and base.eos_token_ids and \
        all(isinstance(i, int) for i in base.eos_token_ids), "ServedBase.eos_token_ids must be a tuple of token ids"
    assert inner.adapter_of(None) is None, "adapter_of(None) must be None (the base model)"
    harness_only = synthetic_release(Path(tmp_path) / "harness-release")
    assert inner.adapter_of(harness_only) is None, "adapter_of(a release without adapter/) must be None"
    adapter = Path(tmp_path) / "adapter-release" / "adapter"
    adapter.mkdir(parents=True, exist_ok=True)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with_adapter = ActiveRelease(scenario=SCENARIO, release_id="rel_kit_adapter", path=adapter.parent)
    found = inner.adapter_of(with_adapter)
    assert found is not None and (Path(found) / "adapter_config.json").is_file(), \
        f"adapter_of(a release with adapter/) must be its PEFT directory, not {found!r}"
    return base


__all__ = [
    "EchoRuntime",
    "check_artifact_store",
    "check_evaluator",
    "check_grader",
    "check_harness_adapter",
    "check_record_filter",
    "check_recipe",
    "check_runtime",
    "check_trainable_base",
    "eval_context",
    "recipe_context",
    "synthetic_batch",
    "synthetic_release",
]
