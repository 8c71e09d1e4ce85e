"""reef-train: the policy-gradient training toolkit Reef's weight recipes share (SAO,
OpenClaw, TTT-Discover), and the sampling logprob convention the local runtime records.

The pieces, each usable alone:

* ``policy`` — ``load_policy``: a *separate* trainable copy of the served base model with a
  LoRA adapter (fresh, or continued from a published ``adapter/`` directory; see the module
  for why never the serving object); ``load_trainable`` / ``load_tokenizer`` take the served
  base as a runtime describes it (``reef_core.TrainableBase.base_model()``, duck-typed: this
  library does not import reef-core); ``save_adapter`` writes the candidate's ``adapter/``;
* ``data`` — ``Sample`` (recorded or sampled completion), ``collate`` into a ``TokenBatch``;
* ``logprobs`` — the one place logprobs come from: ``scaled_log_softmax`` is the convention
  the runtime records (``log_softmax(logits / T)``, one T or one per row; ``sampling`` samples
  through it); ``token_logprobs`` (optionally over chunks of positions, for memory),
  ``vocab_logprobs`` (the whole distribution at each response position), ``response_logprobs``
  recompute it for recorded tokens, so a freshly loaded policy reproduces the recorded
  ``logprobs`` and importance ratios start at 1; ``reference_logprobs`` — the frozen base;
* ``losses`` — ``importance_ratios``, ``clipped_surrogate`` (PPO's, OpenClaw's terms),
  ``dis_loss`` (decoupled importance sampling against recorded rollout logprobs, SAO's),
  ``masked_mean`` — the token-loss pieces recipes share;
* ``options`` — ``LoraOptions``: a new LoRA's shape, its optimizer (AdamW or Adam), gradient
  clipping, device and seed, named as the recipes' options and checked in one place;
* ``learner`` — the one learner every weight recipe trains through: ``Learner`` (the policy,
  a critic when the recipe has one, their optimizers, counters and recipe state, saved and
  loaded as one checkpoint), ``Algorithm`` (what a recipe says: its advantages and loss, one
  step at a time), ``train_step`` / ``run_steps`` (load, step, save: what a trainer backend
  runs); ``checkpoint`` — the learner checkpoint (``adapter/`` + ``learner/``, written
  atomically), ``read_learner_state``; ``critic`` — ``ValueModel``, a LoRA critic with a value
  head;
* ``optim`` — ``make_optimizer`` / ``optimizer_step``: AdamW over the LoRA parameters only;
* ``prompts`` — ``chat_prompt_ids``: a conversation as the prompt ids the local runtime serves
  (the chat template's control tokens parsed, those a client's text quotes kept as text);
* ``rollout`` — sample completions with their sampling logprobs from the training copy;
* ``sampling`` — ``sample_rows`` / ``make_generator``, the next-token sampling both the
  runtime's engine and ``rollout`` use;
* ``backend`` — ``make_trainer``: where a recipe's training step runs, from its ``trainer``
  option: ``local`` (in process) or ``ray`` (one Ray task with the resources asked for,
  ``reef-train[ray]``); a failed or lost step is a ``TrainerError``, never a crash;
  ``base_input`` reads a step's ``base`` input as a ``WorkerBase`` (the served base as the
  worker sees it, for ``load_trainable``);
* ``stopping`` — ``Stopped``: a step asked to stop (``run_steps(..., stop=event)``, a recipe
  passes ``ctx.stopping``) ends at its next optimizer step and saves nothing;
* ``startup`` — ``refuse_untrainable_runtime``, the start-up check a weight recipe makes in a
  server (it uses reef-core, only when called; not re-exported here);
* ``lineage`` — a weight recipe's steps on its scenario's learner lineage (reef-core's
  ``commit.lineage``): where a step's learner starts, the step that advances it (it uses
  reef-core; not re-exported here);
* ``testing`` — a tiny random model built offline, for tests of the toolkit and its users.
"""

import importlib
import sys
import types
from typing import Any

# Names import on first use (PEP 562): ``import reef_train`` stays cheap (no torch), so its
# pytest plugin, loaded by every pytest process, does not pay for torch (a pytest run of one
# small file took 7.0 s with the names imported at once and 3.3 s with this).
_EXPORTS = {
    ".backend": ("LocalTrainer", "Trainer", "TrainerError", "TrainerOptions", "WorkerBase", "base_input",
                 "make_trainer"),
    ".checkpoint": ("LearnerState", "read_learner_state"),
    ".critic": ("ValueModel", "load_critic"),
    ".data": ("Sample", "TokenBatch", "collate", "micro_batches"),
    ".divergence": ("kl_to_reference",),
    ".learner": ("Algorithm", "Learner", "StepPayload", "run_steps", "train_step"),
    ".logprobs": ("CHUNK_TOKENS", "reference_logprobs", "response_logprobs", "scaled_log_softmax", "token_logprobs",
                  "vocab_logprobs"),
    ".losses": ("clipped_surrogate", "dis_loss", "dis_weights", "importance_ratios", "masked_mean"),
    ".optim": ("make_optimizer", "optimizer_step", "trainable_parameters"),
    ".options": ("LoraOptions", "learner_option_problems"),
    ".recorded": ("recorded_tokens_problem", "vocab_size_of"),
    ".policy": ("linear_module_names", "load_policy", "load_tokenizer", "load_trainable", "save_adapter",
                "seed_everything"),
    ".rollout": ("rollout",),
    ".sampling": ("make_generator", "sample_rows"),
    ".stopping": ("Stopped",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The package's module: importing a submodule named like one of its names (``rollout``)
    does not put the submodule in that name's place, as importing every name at once did not."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "Algorithm",
    "CHUNK_TOKENS",
    "Learner",
    "LearnerState",
    "LocalTrainer",
    "LoraOptions",
    "Sample",
    "StepPayload",
    "Stopped",
    "TokenBatch",
    "Trainer",
    "TrainerError",
    "TrainerOptions",
    "ValueModel",
    "WorkerBase",
    "base_input",
    "clipped_surrogate",
    "collate",
    "dis_loss",
    "dis_weights",
    "importance_ratios",
    "learner_option_problems",
    "kl_to_reference",
    "linear_module_names",
    "load_critic",
    "load_policy",
    "load_tokenizer",
    "load_trainable",
    "make_generator",
    "make_optimizer",
    "make_trainer",
    "masked_mean",
    "micro_batches",
    "optimizer_step",
    "read_learner_state",
    "recorded_tokens_problem",
    "reference_logprobs",
    "response_logprobs",
    "rollout",
    "run_steps",
    "sample_rows",
    "save_adapter",
    "scaled_log_softmax",
    "seed_everything",
    "token_logprobs",
    "train_step",
    "trainable_parameters",
    "vocab_logprobs",
    "vocab_size_of",
]
__version__ = "0.1.0"
