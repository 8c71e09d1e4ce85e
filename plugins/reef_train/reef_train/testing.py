"""Test helpers for reef-train and its users: a tiny random Llama built offline, and a
word-loving LoRA trained through the toolkit.

Nothing is downloaded: the tokenizer is built in memory with ``tokenizers`` (install the
``test`` extra) and the model from a ``LlamaConfig`` with a fixed seed.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from .data import Sample
from .policy import load_policy
from .training import PolicyTrainer

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


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn, rendered with the chat template up to the answer."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def train_word_adapter(model_dir: Path, artifact_dir: Path, word: str, prompts: list[str], *, steps: int = 80,
                       lr: float = 2e-2, include_lm_head: bool = True, seed: int = 0, r: int = 8) -> Path:
    """Train a LoRA that answers ``word`` to every prompt; REINFORCE with advantage 1 on the
    target response (i.e. likelihood training through the toolkit). Returns the adapter dir."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    policy = load_policy(model_dir, r=r, alpha=2 * r, include_lm_head=include_lm_head, seed=seed)
    target = tok(word, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    samples = [Sample(prompt_ids=prompt_ids(tok, p), response_ids=target, advantage=1.0) for p in prompts]
    trainer = PolicyTrainer(policy, pad_id=tok.pad_token_id, lr=lr, loss="reinforce", seed=seed)
    trainer.fit(lambda i: samples, steps, progress=False)
    return trainer.save(artifact_dir)


def word_adapter_step(payload: dict, inputs: dict, output: Path) -> dict:
    """A training step in the shape trainer backends run (``reef_train.backend``): train
    ``train_word_adapter``'s LoRA on ``inputs["base"]`` (continuing ``inputs["adapter"]`` when
    given) with ``payload`` = {word, prompts, steps?, lr?}; write ``output/adapter``. Returns the
    metrics and the process it ran in (so a test can tell that it ran elsewhere)."""
    import os

    from transformers import AutoTokenizer

    base, adapter = Path(inputs["base"]), inputs.get("adapter")
    tok = AutoTokenizer.from_pretrained(str(base))
    policy = load_policy(base, adapter, r=8, alpha=16, include_lm_head=True, seed=0)
    target = tok(payload["word"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    samples = [Sample(prompt_ids=prompt_ids(tok, p), response_ids=target, advantage=1.0) for p in payload["prompts"]]
    trainer = PolicyTrainer(policy, pad_id=tok.pad_token_id, lr=payload.get("lr", 2e-2), loss="reinforce", seed=0)
    history = trainer.fit(lambda i: samples, int(payload.get("steps", 4)), progress=False)
    trainer.save(output)
    return {"loss": history[-1]["loss"], "steps": len(history), "pid": os.getpid()}
