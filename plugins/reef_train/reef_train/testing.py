"""Test helpers for reef-train and its users: a tiny random Llama built offline, rollouts
sampled from it, and a word-loving LoRA trained through the shared learner (``Reinforce``, the
smallest ``Algorithm``). The fixtures built on them are ``reef_train.pytest_plugin``'s.

Nothing is downloaded: the tokenizer is built in memory with ``tokenizers`` (install the
``test`` extra) and the model from a ``LlamaConfig`` with a fixed seed.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .data import Sample, collate
from .learner import Algorithm, Learner
from .logprobs import token_logprobs
from .losses import masked_mean
from .options import LoraOptions
from .prompts import chat_prompt_ids

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHARS = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,!?'-:;\n")
# Whole words the test adapters learn to answer: one token each, so a LoRA on this tiny
# model learns them in a few dozen steps (character sequences are much harder for it).
WORDS = ["banana", "cherry", "mango"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_model(out: Path, seed: int = 0) -> Path:
    """A 2-layer random Llama (~80k parameters) with a character vocabulary, saved to ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    core.add_tokens(WORDS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = vocab["</s>"]
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def sample_rollouts(model_dir: Path, prompts: list[list[int]], *, adapter_dir: Path | None = None, seed: int = 0,
                    num_samples: int = 1, max_new_tokens: int = 4, temperature: float = 1.0) -> list[Sample]:
    """``num_samples`` completions of each of ``prompts`` (token ids) from the model in
    ``model_dir`` (with ``adapter_dir``), with their sampling logprobs, grouped by prompt: what a
    weight recipe's test turns into records it trains on."""
    from transformers import AutoTokenizer

    from .policy import load_policy
    from .rollout import rollout

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    policy = load_policy(model_dir, adapter_dir, seed=seed)
    return rollout(policy, prompts, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id], num_samples=num_samples,
                   max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn, rendered with the chat template up to the answer."""
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])


@dataclass(frozen=True)
class Reinforce(Algorithm):
    """REINFORCE on the samples' own advantages, ``-mean(A · log π)`` over response tokens: with
    advantage 1 on a target response it is likelihood training (the word adapters below)."""

    recipe: ClassVar[str] = "reinforce"
    temperature: float = 1.0

    def step(self, learner: Learner, samples: list[Sample]) -> dict[str, Any]:
        batch = collate(samples, learner.pad_id, learner.device)
        learner.policy.train()
        loss = -masked_mean(batch.advantages * token_logprobs(learner.policy, batch, self.temperature),
                            batch.response_mask)
        metrics = {"loss": loss.item()}
        metrics["grad_norm"] = learner.optimizer_step(loss)
        return learner.finish_step(metrics)


def word_learner(model_dir: Path, adapter: Path | None = None, *, lr: float = 2e-2, include_lm_head: bool = True,
                 seed: int = 0, r: int = 8) -> Learner:
    """A ``Reinforce`` learner of a LoRA (rank ``r``, alpha ``2r``) on the model in ``model_dir``."""
    options = LoraOptions(lr=lr, lora_rank=r, lora_alpha=2 * r, lora_lm_head=include_lm_head, seed=seed)
    return Learner(Reinforce(), options, Path(model_dir), adapter=adapter)


def word_samples(tokenizer: Any, word: str, prompts: list[str]) -> list[Sample]:
    """``word`` (then eos) as the answer to each prompt, advantage 1."""
    target = tokenizer(word, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return [Sample(prompt_ids=prompt_ids(tokenizer, p), response_ids=target, advantage=1.0) for p in prompts]


def train_word_adapter(model_dir: Path, artifact_dir: Path, word: str, prompts: list[str], *, steps: int = 80,
                       lr: float = 2e-2, include_lm_head: bool = True, seed: int = 0, r: int = 8) -> Path:
    """Train a LoRA that answers ``word`` to every prompt; REINFORCE with advantage 1 on the
    target response (i.e. likelihood training through the learner). Returns the adapter dir."""
    from transformers import AutoTokenizer

    learner = word_learner(model_dir, lr=lr, include_lm_head=include_lm_head, seed=seed, r=r)
    samples = word_samples(AutoTokenizer.from_pretrained(str(model_dir)), word, prompts)
    for _ in range(steps):
        learner.step(samples)
    return learner.save(artifact_dir) / "adapter"


def word_adapter_step(payload: dict, inputs: dict, output: Path) -> dict:
    """A training step in the shape trainer backends run (``reef_train.backend``): train
    ``train_word_adapter``'s LoRA on ``inputs["base"]`` (continuing ``inputs["adapter"]`` when
    given) with ``payload`` = {word, prompts, steps?, lr?}; write ``output/adapter``. Returns the
    metrics and the process it ran in (so a test can tell that it ran elsewhere)."""
    import os

    from transformers import AutoTokenizer

    base, adapter = Path(inputs["base"]), inputs.get("adapter")
    learner = word_learner(base, adapter, lr=payload.get("lr", 2e-2))
    samples = word_samples(AutoTokenizer.from_pretrained(str(base)), payload["word"], payload["prompts"])
    history = [learner.step(samples) for _ in range(int(payload.get("steps", 4)))]
    learner.save(output)
    return {"loss": history[-1]["loss"], "steps": len(history), "pid": os.getpid()}
