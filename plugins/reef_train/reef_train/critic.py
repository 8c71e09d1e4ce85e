"""A critic: a second LoRA copy of the served base with a scalar value head (SAO's).

The head is a linear layer on the backbone's last hidden state, zero-initialised, so a fresh
critic values every state at 0 until its first updates fit it. Values are aligned like
``reef_train.TokenBatch.targets``: position ``t`` is the state before token ``t + 1`` of the
sequence, i.e. the state in which the policy chose that token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

HEAD_FILE = "value_head.safetensors"
ADAPTER_DIR = "critic"


class ValueModel(torch.nn.Module):
    """``values(batch)`` ``[B, T − 1]`` from a LoRA-wrapped causal LM and a linear value head."""

    def __init__(self, peft_model: Any):
        super().__init__()
        self.lm = peft_model
        inner = peft_model.get_base_model()
        # the transformer without its language-model head: the critic never needs vocabulary logits
        self.backbone = getattr(inner, inner.base_model_prefix)
        hidden = int(inner.config.hidden_size)
        device = next(peft_model.parameters()).device
        self.head = torch.nn.Linear(hidden, 1, device=device, dtype=torch.float32)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden[:, :-1].float()).squeeze(-1)

    def trainable(self) -> list[torch.nn.Parameter]:
        """The critic's LoRA weights and its head (the base stays frozen)."""
        lora = [p for n, p in self.lm.named_parameters() if p.requires_grad and "lora_" in n]
        return lora + list(self.head.parameters())

    def save(self, learner_dir: Path) -> None:
        from safetensors.torch import save_file

        self.lm.save_pretrained(str(learner_dir / ADAPTER_DIR), save_embedding_layers=False)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
                  str(learner_dir / HEAD_FILE))

    def load_head(self, learner_dir: Path) -> None:
        from safetensors.torch import load_file

        state = load_file(str(learner_dir / HEAD_FILE))
        self.head.load_state_dict({k: v.to(self.head.weight.device) for k, v in state.items()})


def load_critic(base: Any, learner_dir: Path | None, **lora: Any) -> ValueModel:
    """A critic continued from ``learner_dir`` (its ``critic/`` adapter and value head), or a
    fresh one (new LoRA, zero head) when it is None; ``lora`` goes to ``reef_train.load_trainable``."""
    from .policy import load_trainable

    adapter = learner_dir / ADAPTER_DIR if learner_dir is not None else None
    model = ValueModel(load_trainable(base, adapter, **lora))
    if learner_dir is not None:
        model.load_head(learner_dir)
    return model
