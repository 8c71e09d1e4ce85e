"""reef-train: the policy-gradient training toolkit Reef's weight recipes share.

Train a LoRA on a separate copy of the served base, from recorded calls or fresh rollouts,
and write the candidate artifact's ``adapter/``. ``reef_train.sampling`` holds the sampling
logprob convention the local runtime (reef-torch) records and the toolkit recomputes.
"""

from .sampling import make_generator, sample_rows
from .training import (
    PolicyTrainer,
    Sample,
    TokenBatch,
    collate,
    importance_ratios,
    kl_penalty,
    linear_module_names,
    load_policy,
    make_optimizer,
    masked_mean,
    optimizer_step,
    policy_gradient_loss,
    ppo_clip_loss,
    reference_logprobs,
    response_logprobs,
    rollout,
    save_adapter,
    seed_everything,
    token_logprobs,
    trainable_parameters,
)

__all__ = [
    "PolicyTrainer",
    "Sample",
    "TokenBatch",
    "collate",
    "importance_ratios",
    "kl_penalty",
    "linear_module_names",
    "load_policy",
    "make_generator",
    "make_optimizer",
    "masked_mean",
    "optimizer_step",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "reference_logprobs",
    "response_logprobs",
    "rollout",
    "sample_rows",
    "save_adapter",
    "seed_everything",
    "token_logprobs",
    "trainable_parameters",
]
__version__ = "0.1.0"
