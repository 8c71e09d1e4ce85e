"""The learner every weight recipe trains through: a checkpoint resumes training exactly (policy,
critic, value head, moments, counters, recipe state), is written atomically, is not resumed by
another recipe or mode, reads the recipes' earlier formats, and ``train_step`` runs through a
trainer backend into a candidate's artifact."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from reef_train import (
    Algorithm,
    Learner,
    LoraOptions,
    Sample,
    StepPayload,
    Stopped,
    WorkerBase,
    collate,
    make_trainer,
    masked_mean,
    read_learner_state,
    run_steps,
    token_logprobs,
)
from reef_train.checkpoint import write_atomically
from reef_train.testing import prompt_ids

PROMPTS = ["hello", "what is two plus two?", "tell me a story"]


@dataclass(frozen=True)
class CriticPG(Algorithm):
    """Policy gradient with a learned baseline: the critic regresses the reward, the policy
    follows reward minus value. Small, but it uses every part a checkpoint holds."""

    recipe: ClassVar[str] = "test"
    counters: ClassVar[tuple[str, ...]] = ("critic_steps", "samples")
    critic_lr: float | None = 1e-2
    mode: str = "baseline"

    def identity(self):
        return {"mode": self.mode}

    def step(self, learner, samples):
        if not samples:
            return {"step": learner.counters["steps"], "samples": 0}  # nothing to learn from: no step
        batch = collate(samples, learner.pad_id, learner.device)
        mask = batch.response_mask
        metrics = {"step": learner.counters["steps"]}
        advantages = batch.advantages
        if learner.critic is not None:
            values = learner.critic.values(batch.input_ids, batch.attention_mask)
            metrics["critic_grad_norm"] = learner.optimizer_step(0.5 * masked_mean((values - batch.advantages) ** 2, mask),
                                                                 critic=True)
            with torch.no_grad():
                advantages = batch.advantages - learner.critic.values(batch.input_ids, batch.attention_mask)
        loss = -masked_mean(advantages * token_logprobs(learner.policy, batch, 0.8), mask)
        metrics["loss"] = loss.item()
        metrics["grad_norm"] = learner.optimizer_step(loss)
        learner.recipe_state["last_loss"] = metrics["loss"]
        return learner.finish_step(metrics, critic_steps=int(learner.critic is not None), samples=len(samples))


@pytest.fixture(scope="module")
def batches(tokenizer):
    words = [tokenizer(w, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
             for w in ("mango", "cherry", "banana")]
    return [[Sample(prompt_ids(tokenizer, p), words[(i + j) % 3], advantage=float((i + 2 * j) % 3) - 1.0)
             for j, p in enumerate(PROMPTS)] for i in range(3)]


def _base(tiny_model_dir):
    return WorkerBase(path=Path(tiny_model_dir), device="cpu")


def _snapshot(learner: Learner) -> dict[str, torch.Tensor]:
    out = {f"policy.{n}": p.detach().clone() for n, p in learner.policy.named_parameters() if p.requires_grad}
    parts = [("policy", learner.optimizer)]
    if learner.critic is not None:
        out.update({f"critic.{i}": p.detach().clone() for i, p in enumerate(learner.critic.trainable())})
        parts.append(("critic", learner.critic_optimizer))
    for name, optimizer in parts:
        for i, p in enumerate(q for g in optimizer.param_groups for q in g["params"]):
            for key, value in optimizer.state[p].items():
                out[f"{name}.moment.{i}.{key}"] = torch.as_tensor(value).detach().clone()
    return out


OPTIONS = {
    "adamw with a critic, clipped": (LoraOptions(lr=2e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, device="cpu"),
                                     CriticPG()),
    "adam without a critic, unclipped": (LoraOptions(lr=2e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True,
                                                     max_grad_norm=None, optimizer="adam", beta2=0.95,
                                                     weight_decay=0.01, device="cpu"), CriticPG(critic_lr=None)),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_two_steps_saved_and_one_after_loading_equal_three_uninterrupted(tiny_model_dir, batches, tmp_path, name):
    options, algorithm = OPTIONS[name]
    base = _base(tiny_model_dir)
    uninterrupted = Learner(algorithm, options, base)
    history = [uninterrupted.step(b) for b in batches]

    first = Learner(algorithm, options, base)
    for b in batches[:2]:
        first.step(b)
    checkpoint = first.save(tmp_path / "checkpoint")
    del first
    resumed = Learner(algorithm, options, base, adapter=checkpoint / "adapter", state=checkpoint / "learner")
    assert resumed.resumed == checkpoint / "learner"
    last = resumed.step(batches[2])

    assert resumed.counters == uninterrupted.counters == {"steps": 3, "critic_steps": 3 * (algorithm.critic_lr is not None),
                                                          "samples": 9}
    assert resumed.recipe_state == uninterrupted.recipe_state
    assert [m["step"] for m in resumed.history] == [0, 1, 2]
    for key, value in history[2].items():
        assert last[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    a, b = _snapshot(uninterrupted), _snapshot(resumed)
    assert a.keys() == b.keys() and any(".moment." in k for k in a)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-7, msg=key)


def test_the_checkpoint_files_and_what_state_json_says(tiny_model_dir, batches, tmp_path):
    options, algorithm = OPTIONS["adamw with a critic, clipped"]
    learner = Learner(algorithm, options, _base(tiny_model_dir))
    learner.step(batches[0])
    out = learner.save(tmp_path / "ck")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert {"adapter/adapter_model.safetensors", "learner/critic/adapter_model.safetensors", "learner/optimizer.pt",
            "learner/state.json", "learner/value_head.safetensors"} <= set(files)
    data = json.loads((out / "learner" / "state.json").read_text())
    assert data["format"] == "reef-learner/1" and data["recipe"] == "test" and data["critic"] is True
    assert data["counters"] == {"steps": 1, "critic_steps": 1, "samples": 3}
    assert data["recipe_state"] == {"mode": "baseline", "last_loss": learner.history[0]["loss"]}
    assert data["lora"] == {"rank": 4, "alpha": 8, "lm_head": True} and len(data["history"]) == 1
    assert set(torch.load(str(out / "learner" / "optimizer.pt"), weights_only=True)) == {"policy", "critic"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_writes_are_atomic_into_a_new_directory_and_replace_parts_of_an_artifact(tmp_path):
    def write(files):
        def fill(tmp):
            for name, text in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(text)
        return fill

    new = write_atomically(tmp_path / "new", write({"adapter/a": "1", "learner/s": "2"}))
    assert (new / "adapter" / "a").read_text() == "1" and (new / "learner" / "s").read_text() == "2"
    # an artifact holding other files: the parts are replaced, the rest stays
    artifact = tmp_path / "artifact"
    (artifact / "harness").mkdir(parents=True)
    (artifact / "harness" / "h").write_text("keep")
    (artifact / "learner" / "critic").mkdir(parents=True)
    (artifact / "learner" / "critic" / "old").write_text("stale")
    write_atomically(artifact, write({"adapter/a": "3", "learner/s": "4"}))
    assert sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*") if p.is_file()) == \
        ["adapter/a", "harness/h", "learner/s"]

    def fails(tmp):
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(tmp_path / "never", fails)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(artifact, fails)
    assert not (tmp_path / "never").exists() and (artifact / "adapter" / "a").read_text() == "3"
    assert not [p for p in [*tmp_path.iterdir(), *artifact.iterdir()] if p.name.startswith(".tmp")]


def test_a_state_of_another_mode_or_recipe_is_not_resumed(tiny_model_dir, batches, tmp_path, caplog):
    options, algorithm = OPTIONS["adamw with a critic, clipped"]
    base = _base(tiny_model_dir)
    learner = Learner(algorithm, options, base)
    learner.step(batches[0])
    ck = learner.save(tmp_path / "ck")

    @dataclass(frozen=True)
    class Other(CriticPG):
        recipe: ClassVar[str] = "other"

    for other, says in ((CriticPG(mode="grouped"), "was trained with mode 'baseline', not 'grouped'"),
                        (Other(), "is recipe 'test''s, not 'other''s")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reef.train"):
            fresh = Learner(other, options, base, adapter=ck / "adapter", state=ck / "learner")
        assert says in caplog.text and fresh.resumed is None
        assert fresh.counters["steps"] == 0 and not fresh.history
        assert not fresh.optimizer.state and torch.count_nonzero(fresh.critic.head.weight) == 0  # a new critic
        # the policy still continues from the adapter it was given
        assert torch.equal(next(p for n, p in fresh.policy.named_parameters() if "lora_B" in n),
                           next(p for n, p in learner.policy.named_parameters() if "lora_B" in n))
    assert read_learner_state(ck / "learner", recipe="other") is None
    assert read_learner_state(ck / "learner", recipe="test").counters["steps"] == 1
    # without its moments: counters and critic resume, the optimizer starts at zero
    kept = Learner(algorithm, options, base, adapter=ck / "adapter", state=ck / "learner", resume_optimizer=False)
    assert kept.counters["steps"] == 1 and not kept.optimizer.state and kept.critic_optimizer.state == {}
    assert torch.equal(kept.critic.head.weight, learner.critic.head.weight)


def test_the_recipes_earlier_formats_are_read(tiny_model_dir, batches, tmp_path):
    options = OPTIONS["adamw with a critic, clipped"][0]

    @dataclass(frozen=True)
    class Sao(CriticPG):
        recipe: ClassVar[str] = "sao"
        mode: str = "sao"

    learner = Learner(Sao(), options, _base(tiny_model_dir))
    learner.step(batches[0])
    ck = learner.save(tmp_path / "ck")
    # rewrite it as reef-recipe-sao wrote it before the shared learner
    state = ck / "learner" / "state.json"
    state.write_text(json.dumps({"format": "reef-sao-learner/1", "mode": "sao", "steps": 1, "actor_steps": 1,
                                 "critic_steps": 1, "rollouts_used": 3, "lora": {"rank": 4}, "history": [{"step": 0}]}))
    moments = torch.load(str(ck / "learner" / "optimizer.pt"), weights_only=True)
    torch.save({"actor": moments["policy"], "critic": moments["critic"]}, str(ck / "learner" / "optimizer.pt"))
    old = read_learner_state(ck / "learner")
    assert (old.recipe, old.recipe_state, old.critic) == ("sao", {"mode": "sao"}, True)
    assert old.counters == {"steps": 1, "actor_steps": 1, "critic_steps": 1, "rollouts_used": 3}
    resumed = Learner(Sao(), options, _base(tiny_model_dir), adapter=ck / "adapter", state=ck / "learner")
    assert resumed.resumed is not None and resumed.optimizer.state and resumed.critic_optimizer.state
    # TTT-Discover's: the variant and a bare optimizer state dict
    state.write_text(json.dumps({"format": "reef-tttd-learner/1", "variant": "tttd-mean", "steps": 4,
                                 "rollouts_used": 32, "lora": {}, "history": []}))
    tttd = read_learner_state(ck / "learner", recipe="tttd")
    assert tttd.counters == {"steps": 4, "rollouts_used": 32} and tttd.recipe_state == {"variant": "tttd-mean"}


def test_train_step_runs_through_a_backend_into_an_artifact(tiny_model_dir, batches, tmp_path):
    options, algorithm = OPTIONS["adamw with a critic, clipped"]
    base = _base(tiny_model_dir)
    artifact = tmp_path / "artifact"
    (artifact / "learner" / "stale").mkdir(parents=True)  # a copy of the release it extends
    (artifact / "reef-release.json").write_text("{}")
    trainer = make_trainer(None)
    result = run_steps(trainer, StepPayload(algorithm, options, batches[:2]), base=base, adapter=None, state=None,
                       output=artifact)
    assert [m["step"] for m in result["steps"]] == [0, 1] and result["counters"]["steps"] == 2
    assert result["resumed"] is False and not (artifact / "learner" / "stale").exists()
    assert (artifact / "reef-release.json").is_file() and read_learner_state(artifact / "learner").counters["steps"] == 2
    again = run_steps(trainer, StepPayload(algorithm, options, [batches[2], []]), base=base,
                      adapter=artifact / "adapter", state=artifact / "learner", output=tmp_path / "next")
    assert again["resumed"] is True and again["counters"]["steps"] == 3 and again["steps"][1] == {"step": 3, "samples": 0}
    # a payload whose batches teach nothing writes nothing
    assert run_steps(trainer, StepPayload(algorithm, options, [[]]), base=base, adapter=None, state=None,
                     output=tmp_path / "empty")["counters"]["steps"] == 0
    assert not any((tmp_path / "empty").iterdir())


_STOP = threading.Event()


@dataclass(frozen=True)
class StopsAt(CriticPG):
    """CriticPG that asks its own step to stop once the learner has made ``at`` steps (as a
    server's SIGTERM would, from another thread, at that moment)."""

    at: int = 1

    def step(self, learner, samples):
        if learner.counters["steps"] == self.at:
            _STOP.set()
        return super().step(learner, samples)


def test_a_step_asked_to_stop_ends_at_its_next_optimizer_step_and_saves_nothing(tiny_model_dir, batches, tmp_path):
    options, _ = OPTIONS["adamw with a critic, clipped"]
    base, trainer = _base(tiny_model_dir), make_trainer(None)
    head = tmp_path / "head"
    run_steps(trainer, StepPayload(CriticPG(), options, batches[:1]), base=base, adapter=None, state=None,
              output=head)
    saved = {p.relative_to(head): p.read_bytes() for p in head.rglob("*") if p.is_file()}
    _STOP.clear()
    with pytest.raises(Stopped, match="stopped before it finished"):  # stopped in its second batch's step
        run_steps(trainer, StepPayload(StopsAt(at=2), options, batches), base=base, adapter=head / "adapter",
                  state=head / "learner", output=tmp_path / "next", stop=_STOP)
    assert not any((tmp_path / "next").rglob("*.safetensors")) and not (tmp_path / "next" / "learner").exists()
    assert {p.relative_to(head): p.read_bytes() for p in head.rglob("*") if p.is_file()} == saved
    # set before the step starts: no batch trains; and an event never set changes nothing
    with pytest.raises(Stopped):
        run_steps(trainer, StepPayload(CriticPG(), options, batches), base=base, adapter=None, state=None,
                  output=tmp_path / "never", stop=_STOP)
    done = run_steps(trainer, StepPayload(CriticPG(), options, batches[:2]), base=base, adapter=None, state=None,
                     output=tmp_path / "whole", stop=threading.Event())
    assert done["counters"]["steps"] == 2 and (tmp_path / "whole" / "learner").is_dir()
