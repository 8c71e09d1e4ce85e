"""Reef: an inference server that learns from the experience it serves.

What a plugin needs is importable from here: the contract of each kind of plugin object
(``Runtime``, ``Recipe``, ``Evaluator``, ``RecordFilter``, ``ArtifactStore``, ``HarnessAdapter``,
``Grader``), the capabilities a runtime may offer (``TrainableBase``: the base model a weight
recipe trains against, reached with ``require_trainable``), the values those objects receive
and return, the errors they raise, and ``hookimpl`` to register them.
"""

from .contracts import (
    ArtifactStore,
    Evaluator,
    Grader,
    HarnessAdapter,
    Recipe,
    RecordFilter,
    Runtime,
    ServedBase,
    TrainableBase,
    option_problems,
    refuse_bad_options,
    require_trainable,
    trainable_base,
)
from .errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
    PluginError,
    PublishConflict,
    ReefError,
    RuntimeCallError,
    RuntimeUnavailable,
    StartupError,
    StepStopped,
)
from .hookspecs import hookimpl, hookspec
from .kit.lazy import lazy_exports
from .types import (
    BASE_RELEASE_ID,
    ActiveRelease,
    Candidate,
    Decision,
    Episode,
    Evaluation,
    InferenceCall,
    PublishedRelease,
    StoredReport,
    base_release,
)

# Values of the learning loop's own packages load on first use: importing reef_core (every
# plugin's entry point does) must not import the store, the config or asyncio's machinery.
__getattr__ = lazy_exports(__name__, {
    ".commit.artifacts": ("StoredRelease", "content_hash"),
    ".commit.gate": ("EvalContext",),
    ".commit.harness": ("HarnessBundle", "HarnessFile"),
    ".commit.lineage": ("LineageHead", "Lineages"),
    ".grow.context": ("RecipeContext",),
    ".observe.experience": ("Batch", "Experience", "ExperienceRecord"),
    ".observe.eligibility": ("FilterContext",),
})

__version__ = "0.1.0"

__all__ = [
    # contracts
    "ArtifactStore",
    "Evaluator",
    "Grader",
    "HarnessAdapter",
    "Recipe",
    "RecordFilter",
    "Runtime",
    # capabilities a runtime may offer
    "TrainableBase",
    "require_trainable",
    "trainable_base",
    # a plugin class's own check of its option values
    "option_problems",
    "refuse_bad_options",
    # values plugins receive and return
    "ActiveRelease",
    "BASE_RELEASE_ID",
    "base_release",
    "Batch",
    "Candidate",
    "Decision",
    "Episode",
    "EvalContext",
    "Evaluation",
    "Experience",
    "ExperienceRecord",
    "FilterContext",
    "HarnessBundle",
    "HarnessFile",
    "InferenceCall",
    "PublishedRelease",
    "RecipeContext",
    "ServedBase",
    "StoredRelease",
    "StoredReport",
    # a weight recipe's learner lineage and the artifact hash its snapshots carry
    "LineageHead",
    "Lineages",
    "content_hash",
    # errors
    "ConfigError",
    "ConflictError",
    "NotFoundError",
    "PluginError",
    "PublishConflict",
    "ReefError",
    "RuntimeCallError",
    "RuntimeUnavailable",
    "StartupError",
    "StepStopped",
    # registering
    "hookimpl",
    "hookspec",
    "__version__",
]
