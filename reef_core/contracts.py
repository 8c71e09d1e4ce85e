"""The contract of every kind of plugin object, as base classes with full signatures.

Each kind a plugin can register (``register_runtimes``, ``register_recipes``, ...) has one
class here. Its *abstract methods* and its *annotated attributes without a value* are what a
registered object must provide; everything else is optional and has a documented default
implementation on the class, written in terms of the required members.

Subclassing is recommended but not required: an object that provides the required members
without subclassing (duck typing) is accepted too, and the kernel wraps it once, when it is
built, in an adapter that supplies the optional members' defaults
(``reef_core.protocols.conform``). Kernel code therefore calls optional members directly and
never probes for them.

Capabilities: what only some objects of a kind can do is a small protocol of its own, not an
optional member with a default, so code that needs it asks once and gets a clear error:
``TrainableBase`` is a runtime that serves a base model a weight recipe can train against
(``require_trainable(runtime, recipe)``).

``reef_core.protocols`` derives the registration checks (``KINDS``, ``missing_members``) from
these classes, and ``docs/plugins.md`` lists them, so checks, docs and code cannot drift.

Runtime errors: raise ``reef_core.errors.RuntimeCallError(message, status=..., body=...)`` for
an answer that is an error (relayed with its status), ``RuntimeUnavailable`` when the model
cannot be reached (502). A constructor or ``start()`` that cannot work as configured should
raise ``ConfigError`` or ``StartupError`` with one sentence naming the fix: ``reef serve``
prints it as one line and exits 2 (any other exception is reported with its type the same way).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import ConfigError, NotFoundError
from .types import ActiveRelease, Candidate, Decision, Evaluation, InferenceCall, UpdateTarget

if TYPE_CHECKING:  # only for annotations: these modules import the kernel's machinery
    from .commit.artifacts import StoredRelease
    from .commit.gate import EvalContext
    from .commit.harness import HarnessBundle
    from .grow.context import RecipeContext
    from .observe import Batch, Experience, FilterContext


# --------------------------------------------------------------------------- serve


class Runtime(ABC):
    """Serves model calls. Registered with ``register_runtimes``; built from the ``runtime`` group.

    A runtime speaks one provider dialect (``openai``, ``anthropic`` or ``responses``, the OpenAI
    Responses API); the server translates client bodies into it before the call and translates
    answers back (a Responses client before a ``responses`` runtime: nothing to translate).

    Model names: ``models()`` says which names a request may carry; the kernel rejects others
    before the runtime is called, so a runtime sees only served names, or any name when it
    declares none (a pass-through proxy).
    """

    #: the provider dialect of the bodies this runtime takes and returns
    dialect: str = "openai"
    #: ``max_tokens`` the server puts into a body translated to the Anthropic dialect when the
    #: client named none (Anthropic requires it)
    default_max_tokens: int = 4096

    async def start(self) -> None:
        """Open connections or load models; called once before serving (before the port is bound).

        Default: nothing to do."""

    def config_problem(self) -> str | None:
        """One sentence saying why this runtime cannot serve as configured (``reef serve`` exits 2
        with it before binding the port), or None when it can. Default: None."""
        return None

    @abstractmethod
    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        """Answer a non-streamed request: return the provider response body."""

    @abstractmethod
    def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        """Answer a streamed request: yield provider stream events as dicts.

        OpenAI dialect: ``chat.completion.chunk`` objects (the server writes ``data: [DONE]``).
        Anthropic dialect: event objects with their ``type`` (``message_start`` …
        ``message_stop``); the server writes the SSE ``event:`` line from ``type``.
        Responses dialect: the Responses events (``response.created`` … ``response.completed``,
        ``response.incomplete`` or ``response.failed``), ``event:`` lines likewise.
        """

    async def stream_batches(self, call: InferenceCall) -> AsyncIterator[list[dict[str, Any]]]:
        """The stream as batches of events: the server writes each batch with one socket write.

        Override when events arrive in groups (one network read upstream). Default: each event
        of ``stream(call)`` as a batch of one."""
        events = self.stream(call)
        try:
            async for event in events:
                yield [event]
        finally:
            aclose = getattr(events, "aclose", None)  # an async iterator need not be closable
            if aclose is not None:
                await aclose()

    async def activate(self, release: ActiveRelease) -> None:
        """Make ``release`` the one serving ``release.scenario`` (hot swap; no restart).

        Requests already running finish on what they started with. Default: nothing to do,
        right for runtimes without weights (an HTTP upstream): harness releases are applied by
        the server itself.
        """

    def models(self) -> list[str]:
        """The model names a request may name; ``GET /v1/models`` lists them (with the aliases).

        The kernel answers a request naming another model with 404 ``model_not_found``, unless
        ``runtime.model_aliases`` maps that name to one of these (the body then names the
        served model). A request without ``model`` is the runtime's to answer with its default.

        An empty list (the default) means "any name is passed through": the runtime forwards to
        a backend whose models it cannot know, and the backend answers unknown names itself. The
        list must be complete once ``start()`` has returned (the kernel reads it then, once).
        """
        return []

    async def aclose(self) -> None:
        """Release connections, threads and models. Default: nothing to release."""


@dataclass(frozen=True)
class ServedBase:
    """The base model a runtime serves, as training loads its own copy of it (``TrainableBase``).

    ``path``: a local directory holding the same weights the runtime serves, with their
    tokenizer, that ``transformers`` loads offline (``config.json``, weights, tokenizer files);
    ``model_id``: the served model's name; ``device``: where training should put its copy
    (``cpu``, ``cuda``, ``cuda:1``; ``auto``: cuda when available); ``dtype``: the precision
    the runtime serves in (``bfloat16``, ``float32``; None: unknown), for information: training
    picks its own; ``eos_token_ids``: the token ids that end a completion.
    """

    path: Path
    model_id: str
    device: str = "auto"
    dtype: str | None = None
    eos_token_ids: tuple[int, ...] = ()


@runtime_checkable
class TrainableBase(Protocol):
    """A runtime capability: "I serve a base model a weight recipe can train against".

    Not a kind of its own: a runtime offers it by having these three methods (subclassing is
    not needed). Weight recipes reach the base through it alone (``require_trainable``) and
    train with ``reef-train``, so no recipe imports a runtime's package.
    """

    def trainable_problem(self) -> str | None:
        """One sentence saying why training cannot load this runtime's base as configured (naming
        the option to set), or None when ``base_model()`` can answer (once started)."""
        ...

    def base_model(self) -> ServedBase:
        """The served base: its local directory, name, device, precision and end-of-turn ids.

        May need ``start()`` first (a runtime that loads its model there); raises
        ``ConfigError`` when ``trainable_problem()`` has a sentence."""
        ...

    def adapter_of(self, release: ActiveRelease | None) -> Path | None:
        """The directory of the LoRA adapter ``release`` serves on this base (a PEFT directory
        training can continue from), or None when it serves the base model itself: no release
        yet, or a release without an adapter (harness only)."""
        ...


def trainable_base(runtime: object) -> TrainableBase | None:
    """``runtime`` when it offers ``TrainableBase`` and can, as configured, say what it serves;
    else None."""
    from .protocols import unwrap  # the kernel may hold a runtime wrapped by ``conform``

    inner = unwrap(runtime)
    if not isinstance(inner, TrainableBase):
        return None
    return inner if inner.trainable_problem() is None else None


def require_trainable(runtime: object, recipe: str) -> TrainableBase:
    """``runtime`` as a ``TrainableBase``, for recipe ``recipe`` that trains weights against it.

    Raises ``ConfigError`` naming the runtime and what to configure when it cannot: a runtime
    without the capability, or one whose ``trainable_problem()`` has a sentence."""
    from .protocols import unwrap

    inner = unwrap(runtime)
    shown = type(inner).__name__
    if not isinstance(inner, TrainableBase):
        raise ConfigError(
            f"recipe {recipe!r} trains against the served base model, but the runtime ({shown}) does not "
            "provide one (it does not implement reef_core.TrainableBase: base_model(), adapter_of(release), "
            "trainable_problem()); use a runtime that serves local weights, e.g. runtime=local, or "
            "runtime=sglang with runtime.base_model_path set."
        )
    problem = inner.trainable_problem()
    if problem is not None:
        raise ConfigError(f"recipe {recipe!r} trains against the served base model, but the runtime ({shown}) "
                          f"cannot provide it: {problem}")
    return inner


class HarnessAdapter(ABC):
    """Renders a release's harness tree as an installer (``GET /reef/harness/install?adapter=``).

    Registered with ``register_harness_adapters``."""

    #: the response's content type
    media_type: str = "text/plain"

    @abstractmethod
    def render(self, bundle: HarnessBundle) -> str:
        """The installer for ``bundle`` (every file of the release's ``harness/`` with its checksum)."""


# --------------------------------------------------------------------------- observe


class RecordFilter(ABC):
    """Narrows a scenario's experience to what is eligible. Registered with ``register_record_filters``.

    The eligibility pool is read in pages and a filter sees the items kept so far plus each new
    page, so ``apply`` must be idempotent: applying it twice keeps what applying it once keeps.
    """

    @abstractmethod
    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        """The items to keep, in their order (``ctx``: ``scenario``, ``store``, ``head_sequence``,
        ``releases_behind(release_id)``)."""


# --------------------------------------------------------------------------- grow


class Recipe(ABC):
    """Turns a batch of experience into a candidate update. Registered with ``register_recipes``.

    The four attributes are required; they may be class attributes or set in ``__init__`` from
    options.
    """

    #: what a candidate changes: ``harness`` | ``adapter`` | ``weights`` | ``none`` (record only)
    update_target: UpdateTarget
    #: record filters the recipe needs: names, ``(name, {options})`` or ``{"name": ..., **options}``
    filters: Sequence[Any]
    #: experiences per candidate; the automatic trigger waits for a full batch (0: manual only)
    batch_size: int
    #: the evaluator used when the config picks none (``evaluator=recipe_default``)
    default_evaluator: str
    #: per response token, how many of the policy's most likely tokens (ids and logprobs) the
    #: runtime should record for this scenario's traffic (``InferenceCall.top_logprobs``); 0, the
    #: default, records none, and serving does no extra work
    top_logprobs: int = 0
    #: whether the recipe trains a learner lineage (``reef_core.commit.lineage``): each step
    #: advances it whatever the gate decides, so the experience of a candidate that is not
    #: published stays consumed (it trained the lineage) instead of returning to the pool
    keeps_lineage: bool = False
    #: the most full batches one step may take when more than one is eligible (what piled up
    #: while the last candidate was evaluated): the step hands ``propose`` a whole number of
    #: batches, up to ``batch_size * max_batches`` experiences, so a recipe whose step trains
    #: one optimizer step per batch keeps pace with the traffic however long its gate takes
    #: (1, the default: one batch a step)
    max_batches: int = 1

    @abstractmethod
    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: RecipeContext) -> Candidate | None:
        """A candidate learnt from ``batch``, or None when the batch teaches nothing.

        ``current`` is the release the scenario serves (its ``release_id``, ``content_hash``
        and ``path``, the materialized artifact with ``harness/`` and/or ``adapter/``), or None
        before the first release. ``ctx.new_artifact()`` gives a scratch copy of it to edit.
        Runs in a thread; the batch is consumed either way, an exception releases it.
        """


# --------------------------------------------------------------------------- evaluate


class Evaluator(ABC):
    """Compares a candidate with the serving release and decides. Registered with ``register_evaluators``.

    The gate is fail-closed: an exception, a ``decide`` that returns no ``Decision``, or an
    evaluation past ``timeout_s`` becomes decision ``error`` and nothing is published.
    """

    #: seconds the whole evaluation may take; None (the default) means the kernel's default (1800)
    timeout_s: float | None = None

    @abstractmethod
    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: EvalContext) -> Evaluation:
        """Measure ``candidate`` against ``current`` (None before the first release). Blocking; runs
        in a thread; ``ctx.complete(body, release)`` calls the runtime with a release's harness."""

    @abstractmethod
    def decide(self, evaluation: Evaluation) -> Decision:
        """The verdict: ``Decision("select" | "reject" | "undecided" | "error", reason)``;
        ``undecided`` when the evidence gathered within the evaluator's cap decides neither way
        (not published, like ``reject``)."""


@runtime_checkable
class Grader(Protocol):
    """Scores one task episode for the ``task_suite``/``threshold`` evaluators; a plain function
    fits. Registered with ``register_graders``."""

    @abstractmethod
    def __call__(self, output: str, task: Mapping[str, Any]) -> float:
        """The score of ``output`` (the model's answer text) for ``task`` (its JSON object), in [0, 1]."""
        ...


# --------------------------------------------------------------------------- publish


class ArtifactStore(ABC):
    """Keeps each scenario's append-only release chain. Registered with ``register_artifact_stores``.

    A release is a commit (an opaque string the store chooses) holding the artifact directory
    plus its manifest (``reef-release.json``: ``release_id``, ``scenario``, ``sequence``,
    ``parent``, ``content_hash``, ...). ``publish`` is the commit point of the whole chain: it
    must be atomic and compare-and-swap.
    """

    @abstractmethod
    def scenarios(self) -> list[str]:
        """Every scenario with at least one release (start-up reconciles these with the database)."""

    @abstractmethod
    def head(self, scenario: str) -> StoredRelease | None:
        """The scenario's newest release, or None before its first."""

    @abstractmethod
    def history(self, scenario: str) -> list[StoredRelease]:
        """Every release of the scenario, newest first."""

    @abstractmethod
    def publish(self, scenario: str, artifact_dir: Path, manifest: dict[str, Any], *,
                expected_head: str | None) -> StoredRelease:
        """Store ``artifact_dir`` with ``manifest`` as the scenario's new head.

        Only if the head is still the commit ``expected_head`` (None: no release yet); otherwise
        raise ``reef_core.errors.PublishConflict`` and change nothing."""

    @abstractmethod
    def materialize(self, scenario: str, commit: str, dest: Path) -> Path:
        """Write the artifact of ``commit`` to the new directory ``dest``; return it. A copy of the
        manifest may come along (``reef-release.json`` is never part of the content hash)."""

    def heads(self) -> dict[str, str]:
        """{scenario: head commit} of every scenario; the follower polls it every 2 s.

        Default: ``head`` of each of ``scenarios()``; override when one query can answer."""
        return {s: h.commit for s in self.scenarios() if (h := self.head(s)) is not None}

    def read_manifest(self, commit: str) -> dict[str, Any]:
        """The manifest of ``commit``.

        Default: searched in the history of every scenario; override when the store can look a
        commit up directly. Raises ``NotFoundError`` for an unknown commit."""
        for scenario in self.scenarios():
            for stored in self.history(scenario):
                if stored.commit == commit:
                    return stored.manifest
        raise NotFoundError(f"the artifact store has no commit {commit}")

    def diff(self, old_commit: str | None, new_commit: str) -> str | None:
        """A unified diff of the files of ``new_commit`` against ``old_commit`` (None: the empty
        tree), for ``GET /reef/scenarios/{s}/releases/{id}``. Default: None, "this store cannot diff"."""
        return None


#: the contract of each kind of registered object, in lifecycle order
CONTRACTS: dict[str, type] = {
    "runtime": Runtime,
    "harness_adapter": HarnessAdapter,
    "record_filter": RecordFilter,
    "recipe": Recipe,
    "evaluator": Evaluator,
    "grader": Grader,
    "artifact_store": ArtifactStore,
}

# --------------------------------------------------------------------------- options


def option_problems(cls: Any, options: Mapping[str, Any]) -> list[str]:
    """What a plugin class says is wrong with ``options`` (its constructor's keyword arguments,
    defaults filled in) before it is built: ``cls.option_problems(options)``, or none.

    Any plugin class may define the classmethod ``option_problems(options) -> list[str]``: the
    problems of the values that their annotations cannot express (ranges, choices, combinations),
    one sentence each, found without building anything heavy (no model, no torch import). The
    kernel asks it when it checks a configuration (``reef config`` and every command that
    composes one), so a value ``reef serve`` would refuse exits 2 there too; the constructor
    asks it as well (``refuse_bad_options``), so both say the same sentence. A ``TypeError`` or
    ``ValueError`` it raises counts as one problem, any other exception as one that names the
    failed check. The kernel probes for this member (the class exists before any object does),
    unlike the instance members above."""
    own = getattr(cls, "option_problems", None)
    if not callable(own):
        return []
    try:
        return [str(p) for p in own(dict(options))]
    except (TypeError, ValueError) as exc:
        return [" ".join(str(exc).split()) or type(exc).__name__]
    except Exception as exc:  # noqa: BLE001 - a plugin's faulty check is reported, never a traceback
        return [f"its option check failed ({type(exc).__name__}: {' '.join(str(exc).split())})"]


def refuse_bad_options(cls: Any, values: Mapping[str, Any]) -> None:
    """In a constructor: ``refuse_bad_options(type(self), locals())`` raises one ``ValueError``
    naming every problem ``cls.option_problems`` finds in the arguments (``self`` and other
    non-option names are left out)."""
    options = {k: v for k, v in values.items() if k != "self" and not k.startswith("__")}
    problems = option_problems(cls, options)
    if problems:
        raise ValueError("; ".join(problems))


__all__ = [
    "CONTRACTS",
    "ArtifactStore",
    "Evaluator",
    "Grader",
    "HarnessAdapter",
    "Recipe",
    "RecordFilter",
    "Runtime",
    "ServedBase",
    "TrainableBase",
    "option_problems",
    "refuse_bad_options",
    "require_trainable",
    "trainable_base",
]
