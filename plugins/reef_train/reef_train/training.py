"""Policy-gradient training toolkit shared by weight recipes (SAO, OpenClaw, TTT-Discover).

The pieces, each usable alone:

* ``load_policy`` — a *separate* trainable copy of the served base model with a LoRA adapter
  (fresh, or continued from a published ``adapter/`` directory);
* ``collate`` + ``token_logprobs`` — recompute the log-probability of recorded response
  tokens under the current policy, with the same convention the runtime records
  (``log_softmax(logits / T)``; see ``reef_train.sampling``), so a freshly loaded policy
  reproduces the recorded ``logprobs`` and importance ratios start at 1;
* ``reference_logprobs`` — the frozen base through ``with model.disable_adapter()``;
* ``importance_ratios``, ``policy_gradient_loss`` (REINFORCE with advantages),
  ``ppo_clip_loss``, ``kl_penalty`` — masked token losses;
* ``make_optimizer`` / ``optimizer_step`` — AdamW over the LoRA parameters only;
* ``save_adapter`` — write the candidate artifact's ``adapter/`` (a PEFT directory);
* ``rollout`` — sample completions with their sampling logprobs from the training copy;
* ``PolicyTrainer`` — the usual loop around them, with a tqdm progress bar.

Why a separate model copy rather than training the serving object under a lock: a
gradient step mutates LoRA weights in place, and the serving engine batches requests of
many scenarios through one PeftModel on its own thread. Sharing it would mean either
pausing all serving for the whole training run or risking a forward that reads
half-updated weights. The copy costs one more set of base weights in memory (0.5 GB for
SmolLM2 in fp32, reloaded from the cached directory in well under a second) and keeps
serving and learning fully independent: training produces an adapter directory, and only
the Commit step's ``runtime.activate`` brings it into serving.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .sampling import make_generator, sample_rows

# ------------------------------------------------------------------ data


@dataclass
class Sample:
    """One recorded (or freshly sampled) completion to learn from.

    ``logprobs`` are the behaviour policy's sampling logprobs (``call.extras["logprobs"]``);
    ``advantage`` is a scalar for the whole response or one value per response token.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None = None
    advantage: float | list[float] = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenBatch:
    """Right-padded ``prompt + response`` sequences; every per-token tensor is aligned with
    ``targets`` (position t predicts ``input_ids[:, t + 1]``), shape ``[B, T - 1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: Any) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.targets,
                                                     self.response_mask, self.old_logprobs, self.advantages)))


def collate(samples: Sequence[Sample], pad_id: int, device: Any = "cpu") -> TokenBatch:
    """Pack ``samples`` into a ``TokenBatch`` (missing logprobs become 0, masked anyway)."""
    if not samples:
        raise ValueError("collate() needs at least one sample.")
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    resp = torch.zeros((n, width - 1), dtype=torch.float32)
    old = torch.zeros((n, width - 1), dtype=torch.float32)
    adv = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p == 0 or r == 0:
            raise ValueError(f"Sample {i} needs a non-empty prompt and response.")
        ids[i, : p + r] = torch.tensor(list(s.prompt_ids) + list(s.response_ids))
        attn[i, : p + r] = 1
        span = slice(p - 1, p - 1 + r)  # positions whose next token is a response token
        resp[i, span] = 1.0
        if s.logprobs is not None:
            if len(s.logprobs) != r:
                raise ValueError(f"Sample {i} has {len(s.logprobs)} logprobs for {r} response tokens.")
            old[i, span] = torch.tensor(s.logprobs, dtype=torch.float32)
        if isinstance(s.advantage, (list, tuple)):
            if len(s.advantage) != r:
                raise ValueError(f"Sample {i} has {len(s.advantage)} per-token advantages for {r} tokens.")
            adv[i, span] = torch.tensor(s.advantage, dtype=torch.float32)
        else:
            adv[i, span] = float(s.advantage)
    return TokenBatch(ids, attn, ids[:, 1:].clone(), resp, old, adv).to(device)


# ------------------------------------------------------------------ logprobs


def token_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` of each target token, ``[B, T - 1]`` (mask it yourself).

    Gradients flow when called outside ``torch.no_grad()``. ``temperature <= 0`` (greedy
    records) is taken as 1, matching what the runtime records for greedy decoding.
    """
    t = temperature if temperature > 0 else 1.0
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)


def reference_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """Token logprobs under the frozen base model (the adapter disabled), without gradients."""
    with torch.no_grad(), model.disable_adapter():
        return token_logprobs(model, batch, temperature)


def response_logprobs(model: Any, samples: Sequence[Sample], pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """Per-sample logprobs of the response tokens under ``model`` (no gradients)."""
    device = next(model.parameters()).device
    batch = collate(samples, pad_id, device)
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    out = []
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        out.append(lp[i, start : start + len(s.response_ids)].tolist())
    return out


# ------------------------------------------------------------------ losses


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 where nothing is masked in)."""
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def importance_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``π_new / π_old`` = ``exp(logp - old_logp)``; 1 outside the mask."""
    return torch.exp((logprobs - old_logprobs) * mask)


def policy_gradient_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE: ``-mean(A · log π)`` over response tokens (advantages broadcast per token)."""
    return -masked_mean(advantages * logprobs, mask)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, token-mean; returns ``(loss, {"clip_fraction", "ratio_mean"})``.

    ``clip_high`` (default ``clip_low``) allows the asymmetric "clip-higher" variant.
    """
    high = clip_low if clip_high is None else clip_high
    ratio = importance_ratios(logprobs, old_logprobs, mask)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    loss = -masked_mean(surrogate, mask)
    with torch.no_grad():
        was_clipped = ((ratio - clipped).abs() > 1e-8).float()
        stats = {"clip_fraction": float(masked_mean(was_clipped, mask)), "ratio_mean": float(masked_mean(ratio, mask))}
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Token-mean KL(π ‖ π_ref) estimate from sampled tokens: ``k1`` = log ratio, ``k3`` =
    ``exp(-d) - 1 + d`` with ``d = logp - ref`` (unbiased and always ≥ 0)."""
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return masked_mean(d, mask)
    if estimator == "k3":
        return masked_mean(torch.exp(-d) - 1.0 + d, mask)
    raise ValueError(f"Unknown KL estimator {estimator!r}; use 'k1' or 'k3'.")


# ------------------------------------------------------------------ model, optimizer, artifacts


def seed_everything(seed: int) -> None:
    """Seed python, numpy (when present) and torch for a reproducible training run."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:
        pass


def linear_module_names(model: Any, include_lm_head: bool = False) -> list[str]:
    """Suffixes of the model's ``nn.Linear`` layers, the usual LoRA targets.

    Add ``lm_head`` for tiny randomly initialised models: without it LoRA cannot sharpen
    their near-uniform logits (see env notes)."""
    names = set()
    for full, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            names.add(full.rsplit(".", 1)[-1])
    if not include_lm_head:
        names.discard("lm_head")
    else:
        names.add("lm_head")
    return sorted(names)


def load_policy(
    model_dir: str | Path,
    adapter_dir: str | Path | None = None,
    *,
    r: int = 16,
    alpha: int = 32,
    target_modules: Sequence[str] | str | None = None,
    include_lm_head: bool = False,
    device: str = "cpu",
    dtype: Any = torch.float32,
    seed: int | None = None,
) -> Any:
    """A trainable PeftModel on a fresh copy of the base in ``model_dir``.

    With ``adapter_dir`` (e.g. the serving release's ``adapter/``) training continues from
    that adapter; otherwise a new LoRA (``r``, ``alpha``, ``target_modules`` — default every
    linear layer) starts at zero, i.e. exactly the base model's behaviour.
    """
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    if seed is not None:
        seed_everything(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True).to(device)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    else:
        targets = list(target_modules) if isinstance(target_modules, (list, tuple)) else target_modules
        config = LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=0.0,
            target_modules=targets or linear_module_names(base, include_lm_head),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
    model.train()
    return model


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: Any, lr: float = 1e-4, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW over the LoRA parameters only; refuses a model whose base weights would train."""
    params = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "lora_" not in name:
            raise ValueError(f"Parameter {name} is trainable but not a LoRA weight; load the policy with load_policy().")
        params.append(p)
    if not params:
        raise ValueError("The model has no trainable LoRA parameters; load the adapter with is_trainable=True.")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def optimizer_step(model: Any, optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_grad_norm: float | None = 1.0) -> float:
    """Backward, clip, step, zero; returns the gradient norm before clipping."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = trainable_parameters(model)
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        norm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in params if p.grad is not None))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def save_adapter(model: Any, artifact_dir: str | Path) -> Path:
    """Write the LoRA adapter as ``<artifact_dir>/adapter/`` (a PEFT directory) and return it.

    ``save_embedding_layers=False`` keeps a targeted ``lm_head``'s full base weight out of the
    file, which would otherwise break hot-loading next to other adapters."""
    out = Path(artifact_dir) / "adapter"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), save_embedding_layers=False)
    return out


# ------------------------------------------------------------------ sampling


def rollout(
    model: Any,
    prompts: Sequence[list[int]],
    *,
    pad_id: int,
    eos_ids: Iterable[int],
    num_samples: int = 1,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[Sample]:
    """Sample ``num_samples`` completions per prompt from ``model`` (a training copy), with
    their sampling logprobs in the runtime's convention. Samples come out grouped by prompt."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    eos = set(eos_ids)
    rows = [list(p) for p in prompts for _ in range(num_samples)]
    gens = [make_generator(None if seed is None else seed + i) for i in range(len(rows))]
    width = max(len(p) for p in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    out_ids: list[list[int]] = [[] for _ in rows]
    out_lp: list[list[float]] = [[] for _ in rows]
    done = [False] * len(rows)
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            step_ids, step_pos, attn = ids, positions, mask
            for _ in range(max_new_tokens):
                logits = model(
                    input_ids=step_ids.to(device), attention_mask=attn.to(device), position_ids=step_pos.to(device),
                    use_cache=True, logits_to_keep=1, **{_cache_kw(model): cache},
                ).logits[:, -1, :]
                toks, lps = sample_rows(logits, [temperature] * len(rows), [top_p] * len(rows), gens)
                for i, (t, lp) in enumerate(zip(toks, lps)):
                    if not done[i]:
                        out_ids[i].append(t)
                        out_lp[i].append(lp)
                        done[i] = t in eos
                if all(done):
                    break
                step_ids = torch.tensor(toks)[:, None]
                step_pos = step_pos[:, -1:] + 1
                attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=torch.long)], 1)
    finally:
        model.train(was_training)
    return [Sample(prompt_ids=p, response_ids=r, logprobs=lp) for p, r, lp in zip(rows, out_ids, out_lp)]


def _cache_kw(model: Any) -> str:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


# ------------------------------------------------------------------ the loop


class PolicyTrainer:
    """A policy-gradient step over ``Sample`` batches: REINFORCE or PPO-clip, optional KL
    to the frozen base, AdamW on the LoRA weights, deterministic given ``seed``.

    ``loss="reinforce"`` ignores the recorded logprobs; ``loss="ppo"`` uses them as the
    behaviour policy (fall back to the current policy's own logprobs when a sample has none).
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        lr: float = 1e-4,
        loss: str = "ppo",
        clip_low: float = 0.2,
        clip_high: float | None = None,
        kl_coef: float = 0.0,
        temperature: float = 1.0,
        max_grad_norm: float | None = 1.0,
        seed: int | None = None,
    ):
        if loss not in ("ppo", "reinforce"):
            raise ValueError(f"Unknown loss {loss!r}; use 'ppo' or 'reinforce'.")
        if seed is not None:
            seed_everything(seed)
        self.model = model
        self.pad_id = pad_id
        self.loss = loss
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_coef = kl_coef
        self.temperature = temperature
        self.max_grad_norm = max_grad_norm
        self.optimizer = make_optimizer(model, lr=lr)
        self.device = next(model.parameters()).device
        self.steps = 0

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        self.model.train()
        batch = collate(samples, self.pad_id, self.device)
        mask = batch.response_mask
        logp = token_logprobs(self.model, batch, self.temperature)
        metrics: dict[str, float] = {}
        if self.loss == "reinforce":
            loss = policy_gradient_loss(logp, batch.advantages, mask)
        else:
            old = batch.old_logprobs
            missing = [i for i, s in enumerate(samples) if s.logprobs is None]
            if missing:
                old = old.clone()
                old[missing] = logp.detach()[missing]
            loss, stats = ppo_clip_loss(logp, old, batch.advantages, mask, self.clip_low, self.clip_high)
            metrics.update(stats)
        if self.kl_coef:
            ref = reference_logprobs(self.model, batch, self.temperature)
            kl = kl_penalty(logp, ref, mask)
            loss = loss + self.kl_coef * kl
            metrics["kl"] = kl.item()
        metrics["loss"] = loss.item()
        metrics["grad_norm"] = optimizer_step(self.model, self.optimizer, loss, self.max_grad_norm)
        self.steps += 1
        return metrics

    def fit(
        self,
        batches: Callable[[int], Sequence[Sample]] | Iterable[Sequence[Sample]],
        steps: int,
        *,
        desc: str = "train",
        progress: bool = True,
    ) -> list[dict[str, float]]:
        """Run ``steps`` steps; ``batches`` is a callable ``step -> samples`` or an iterable."""
        source = batches if callable(batches) else None
        iterator = None if source else iter(batches)
        history = []
        bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False)
        for i in bar:
            samples = source(i) if source else next(iterator)
            metrics = self.step(samples)
            history.append(metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        return history

    def save(self, artifact_dir: str | Path) -> Path:
        return save_adapter(self.model, artifact_dir)
