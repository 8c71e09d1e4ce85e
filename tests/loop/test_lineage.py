"""The learner lineage: its head is the last completed step (compare-and-swap, a kill -9
anywhere in a step leaves the previous head), resets remember why, and the experience a
lineage step trained on stays consumed whatever the gate decides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from reef_core.cli import main
from reef_core.commit.lineage import HEAD_FILE, STEPS_DIR, Lineages
from reef_core.compose import build_reef
from reef_core.errors import ConflictError
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, RecordStore, new_id
from reef_core.types import Candidate, Decision, Evaluation

from .conftest import add_plugin, feedback_rules_config, grow_steps, settings_for, write_config
from .test_experience_return import AlwaysReject, Down, NewRuleRecipe, _kernel, _seed


def _checkpoint(path, text: str):
    (path / "adapter").mkdir(parents=True)
    (path / "adapter" / "weights.txt").write_text(text)
    (path / "learner").mkdir()
    (path / "learner" / "state.json").write_text(json.dumps({"text": text}))
    return path


def test_each_step_moves_the_head_by_compare_and_swap(tmp_path):
    lineages = Lineages(tmp_path / "state")
    assert lineages.head("s") is None
    first = lineages.advance("s", _checkpoint(tmp_path / "a", "one"), {"serving": None}, expected=None)
    assert (first.step, (first.checkpoint / "adapter" / "weights.txt").read_text()) == (1, "one")
    second = lineages.advance("s", _checkpoint(tmp_path / "b", "two"), {"serving": None}, expected=first.id, steps=2)
    assert second.step == 3 and lineages.head("s") == second
    with pytest.raises(ConflictError, match="moved"):   # a step that started from the old head
        lineages.advance("s", _checkpoint(tmp_path / "c", "three"), {}, expected=first.id)
    assert lineages.head("s") == second
    assert [p.name for p in (lineages.dir_of("s") / STEPS_DIR).iterdir()] == [second.checkpoint.name]
    assert lineages.head("other") is None               # one lineage per scenario


def test_reset_and_publish_are_remembered(tmp_path):
    lineages = Lineages(tmp_path / "state")
    head = lineages.advance("s", _checkpoint(tmp_path / "a", "one"), {}, expected=None)
    head = lineages.advance("s", _checkpoint(tmp_path / "b", "two"), {}, expected=head.id)
    published = lineages.note_published("s", head.id, "rel1")
    assert (published.published_step, published.published_release) == (2, "rel1")
    assert lineages.note_published("s", "not-the-head", "rel2") is None
    head = lineages.advance("s", _checkpoint(tmp_path / "c", "three"), {}, expected=published.id)
    assert head.to_dict()["steps_since_publish"] == 1
    # policy lag in lineage steps: rel1 serves step 2's state; a release never seen counts from the start
    assert (head.lag("rel1"), head.lag("rel-unknown"), head.lag(None)) == (1, 3, 3)
    reset = lineages.reset("s", to_release="rel0", reason="rollback to rel0")
    assert reset.checkpoint is None and reset.step == 3
    assert reset.last_reset["to_release"] == "rel0" and reset.last_reset["reason"] == "rollback to rel0"
    assert not any((lineages.dir_of("s") / STEPS_DIR).iterdir())
    again = lineages.advance("s", _checkpoint(tmp_path / "d", "four"), {}, expected=reset.id)
    assert again.last_reset == reset.last_reset and again.step == 4


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import reef_core.commit.lineage as lineage

    where = sys.argv[3]
    real_replace = os.replace

    def dying_replace(src, dst):
        if where == "before_head" and str(dst).endswith("HEAD.json"):
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
        if where == "after_step_copied" and Path(dst).parent.name == "steps":
            os.kill(os.getpid(), signal.SIGKILL)

    lineage.os.replace = dying_replace
    lineages = lineage.Lineages(Path(sys.argv[1]))
    head = lineages.head("s")
    lineages.advance("s", Path(sys.argv[2]), {}, expected=head.id)
""")


@pytest.mark.parametrize("where", ["after_step_copied", "before_head"])
def test_a_kill_9_mid_step_leaves_the_last_completed_step_as_head(tmp_path, where):
    lineages = Lineages(tmp_path / "state")
    done = lineages.advance("s", _checkpoint(tmp_path / "a", "done"), {}, expected=None)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "state"), str(_checkpoint(tmp_path / "b", "lost")),
                           where], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    head = Lineages(tmp_path / "state").head("s")   # a restart
    assert head == done and (head.checkpoint / "adapter" / "weights.txt").read_text() == "done"
    assert json.loads((lineages.dir_of("s") / HEAD_FILE).read_text())["id"] == done.id
    # the next step goes on from it, and the killed step's leftovers go
    nxt = lineages.advance("s", _checkpoint(tmp_path / "c", "next"), {}, expected=head.id)
    assert nxt.step == 2 and [p.name for p in (lineages.dir_of("s") / STEPS_DIR).iterdir()] == [nxt.checkpoint.name]


class LineageRuleRecipe(NewRuleRecipe):
    """A recipe that keeps a lineage (here only the flag: what the kernel looks at)."""

    keeps_lineage = True

    def propose(self, batch, current, ctx):
        cand = super().propose(batch, current, ctx)
        return Candidate(scenario=cand.scenario, recipe=cand.recipe, artifact_dir=cand.artifact_dir,
                         summary=cand.summary, metadata={"lineage": {"head": f"h{len(self.batches)}", "step": 1}})


class AdvancingRecipe(NewRuleRecipe):
    """A lineage-keeping recipe that advances a real lineage each step, its candidate a snapshot."""

    keeps_lineage = True

    def __init__(self, batch_size: int = 1, state_dir=None):
        super().__init__(batch_size)
        self.lineages = Lineages(state_dir)

    def propose(self, batch, current, ctx):
        cand = super().propose(batch, current, ctx)
        head = self.lineages.head(batch.scenario)
        new = self.lineages.advance(batch.scenario, cand.artifact_dir, {}, expected=head.id if head else None)
        return Candidate(scenario=cand.scenario, recipe=cand.recipe, artifact_dir=cand.artifact_dir,
                         summary=cand.summary, metadata={"lineage": {"head": new.id, "step": new.step}})


def test_a_published_snapshot_is_where_the_lineage_goes_on_from(tmp_path, store_url):
    add_plugin("recipe", "advancing", AdvancingRecipe)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "advancing", "batch_size": 1}
    config["record_store"] = {"url": store_url}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    rec, rpt = _seed(reef.store, scenario="default")
    [step] = grow_steps(reef, 1)
    assert step.outcome == "published", step.reason
    head = Lineages(tmp_path / "state").head("default")
    assert (head.step, head.published_step, head.published_release) == (1, 1, step.release_id)
    assert head.to_dict()["steps_since_publish"] == 0


def test_a_rejected_lineage_step_keeps_its_experience_consumed(tmp_path, store_url):
    add_plugin("evaluator", "always_reject", AlwaysReject)
    add_plugin("recipe", "lineage_rule", LineageRuleRecipe)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always_reject"})
    config["recipe"] = {"name": "lineage_rule", "batch_size": 1}
    config["loop"].update(retry_after_new=0, max_attempts=3)
    config["record_store"] = {"url": store_url}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    rec, rpt = _seed(reef.store, scenario="default")
    steps = grow_steps(reef, 2)
    # the lineage trained on the report: rejected, it is not retried (a harness recipe's is)
    assert [s.outcome for s in steps] == ["rejected", "nothing"]
    assert reef.store.consumption_states([rec, rpt]) == {rec: ("held", 1), rpt: ("held", 1)}


def test_an_interrupted_lineage_snapshot_keeps_its_experience_consumed(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url)
    assert not reef.learning.plan("default").recipe.keeps_lineage    # what the step does not look at here
    rec, rpt = _seed(reef.store, scenario="default")
    cid = new_id("cand")
    reef.store.consume(cid, "default", record_ids=[rec], report_ids=[rpt])
    reef.store.add_candidate(CandidateRow(id=cid, scenario="default", recipe="sao", status="evaluating",
                                          artifact={"content_hash": "x", "metadata": {"lineage": {"head": "h1"}}}))
    grow_steps(reef, 1)
    assert reef.store.get_candidate(cid).status == "error"
    assert reef.store.consumption_states([rpt]) == {rpt: ("held", 1)}


def _invoke(tmp_path, *args: str):
    cfg = write_config(tmp_path / "cli.yaml", feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                   evaluator={"name": "always"}))
    return CliRunner().invoke(main, [*args, "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                     f"runtime.upstream_url={Down.url}"])


def test_reef_lineage_shows_it_rollback_and_reset_reset_it(tmp_path):
    from .test_recovery import _seed as seed_feedback

    none = _invoke(tmp_path, "lineage")
    assert none.exit_code == 0 and "scenario 'default' has no learner lineage" in none.output
    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    for feedback in ("Be brief", "Cite sources"):
        seed_feedback(store, feedback)
        assert "published" in _invoke(tmp_path, "grow").output
    first, second = reversed(store.list_releases("default"))
    store.close()
    # a weight recipe's lineage, two steps past the second release, which it published at step 1
    lineages = Lineages(tmp_path / "state")
    head = lineages.advance("default", _checkpoint(tmp_path / "a", "one"), {"serving": second.release_id},
                            expected=None)
    lineages.note_published("default", head.id, second.release_id)
    lineages.advance("default", _checkpoint(tmp_path / "b", "two"), {"serving": second.release_id},
                     expected=lineages.head("default").id, steps=2)
    shown = _invoke(tmp_path, "lineage", "default")
    assert shown.exit_code == 0, shown.output
    assert "default: lineage step 3" in shown.output and "steps since the last publish: 2" in shown.output
    assert f"release {second.release_id} at step 1" in shown.output and "last reset: never" in shown.output

    back = _invoke(tmp_path, "rollback", "-s", "default", first.release_id)
    assert back.exit_code == 0, back.output
    assert "the learner lineage starts again from" in back.output and "2 unpublished step(s) dropped" in back.output
    head = Lineages(tmp_path / "state").head("default")
    assert head.checkpoint is None and head.last_reset["reason"] == f"reef rollback to {first.release_id}"
    rolled = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    assert head.last_reset["to_release"] == rolled.head_release("default").release_id
    rolled.close()
    as_json = json.loads(_invoke(tmp_path, "lineage", "--json").output)
    assert as_json["head"]["last_reset"]["reason"] == f"reef rollback to {first.release_id}"
    assert as_json["head"]["steps_since_publish"] == 0

    reset = _invoke(tmp_path, "lineage", "reset", "default", "--reason", "drifted")
    assert reset.exit_code == 0 and "default: lineage reset" in reset.output
    assert "drifted" in _invoke(tmp_path, "lineage").output


def test_a_rollback_that_publishes_nothing_says_it_reset_the_lineage(tmp_path):
    """Rolling back to what serves publishes nothing, and still undoes the unpublished steps:
    the message says both."""
    Lineages(tmp_path / "state").advance("default", _checkpoint(tmp_path / "a", "one"), {}, expected=None)
    back = _invoke(tmp_path, "rollback", "base")
    assert back.exit_code == 0, back.output
    assert "nothing was published" in back.output
    assert "the learner lineage starts again from the base model (1 unpublished step(s) dropped)" in back.output
    assert Lineages(tmp_path / "state").head("default").checkpoint is None


def test_odd_scenarios_and_an_unreadable_head_are_one_line_errors(tmp_path):
    long_name = "a" + "a:" * 90  # 181 characters: 361 once each ':' is escaped, past a file name's 255
    for words in ([long_name], ["reset", long_name], ["a" * 300]):
        out = _invoke(tmp_path, "lineage", *words)
        assert out.exit_code == 2 and "not a valid scenario name" in out.output and "Traceback" not in out.output
    assert _invoke(tmp_path, "rollback", "-s", "", "base").exit_code == 2  # never the default scenario
    head = tmp_path / "state" / "lineage" / "other" / HEAD_FILE
    head.parent.mkdir(parents=True)
    for text in ('{"id": "x", "step": ', '{"id": "x"}', "[]"):
        head.write_text(text)
        shown = _invoke(tmp_path, "lineage", "other")
        assert shown.exit_code == 1 and shown.output.startswith("Error: the learner lineage head"), shown.output
        assert "reef lineage reset other" in shown.output
    reset = _invoke(tmp_path, "lineage", "reset", "other")
    assert reset.exit_code == 0, reset.output
    assert Lineages(tmp_path / "state").head("other").checkpoint is None  # the unreadable head replaced


def test_reef_lineage_reads_the_state_of_the_server_started_here(tmp_path, monkeypatch):
    """Given no config, `reef lineage` reads the state directory the server started in this
    directory serves, as `reef releases` does (not the configured default ``.reef``)."""
    from reef_core import served_config
    from reef_core.cli.common import load

    state = tmp_path / "elsewhere"
    Lineages(state).advance("default", _checkpoint(tmp_path / "a", "one"), {}, expected=None)
    monkeypatch.setenv("REEF_SERVERS_DIR", str(tmp_path / "servers"))
    monkeypatch.chdir(tmp_path)
    overrides = (f"server.state_dir={state}", f"runtime.upstream_url={Down.url}")
    served_config.record_composition(None, overrides)  # as `reef serve` started here records it
    try:
        served_config.announce(load(overrides)[1], url=None)
    finally:
        served_config._composition = None
    out = CliRunner().invoke(main, ["lineage"])
    assert out.exit_code == 0, out.output
    assert "default: lineage step 1" in out.output


def test_the_lineage_route(tmp_path):
    from reef_core.testing import ReefServer

    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "always"})
    Lineages(tmp_path / "state").advance("default", _checkpoint(tmp_path / "a", "one"), {}, expected=None)
    with ReefServer(tmp_path, settings=settings_for(tmp_path, Down, config)) as server:
        client = server.client()
        body = client.get("/reef/scenarios/default/lineage").json()
        assert body["head"]["step"] == 1 and body["head"]["last_reset"] is None and body["serving_release_id"] is None
        assert client.get("/reef/scenarios/other/lineage").json()["head"] is None


def test_two_servers_on_one_store_never_train_a_batch_into_two_lineages(tmp_path, store_url):
    """Two kernels (their own state directories, so their own lineages) on one record store and
    one release chain, stepping at the same time: every report trains one lineage step once."""
    import threading

    add_plugin("evaluator", "always_reject", AlwaysReject)
    add_plugin("recipe", "advancing", AdvancingRecipe)
    reefs = []
    for name in ("a", "b"):
        config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always_reject"})
        config["recipe"] = {"name": "advancing", "batch_size": 1}
        config["loop"].update(retry_after_new=0, max_attempts=3)
        config["record_store"] = {"url": store_url}
        (tmp_path / name).mkdir()
        settings = settings_for(tmp_path / name, Down, config, [f"artifact_store.path={tmp_path / 'artifacts.git'}"])
        reefs.append(build_reef(settings, get_plugins(), background=False))
    reports = [_seed(reefs[0].store, f"q{i}", scenario="default")[1] for i in range(6)]
    results: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, grow_steps(reefs[i], 6))) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    trained = [b for r in reefs for b in r.learning.plan("default").recipe.batches]
    assert sorted(rpt for batch in trained for rpt in batch) == sorted(reports)   # each report once
    steps = [Lineages(tmp_path / name / "state").head("default") for name in ("a", "b")]
    assert sum(h.step for h in steps if h is not None) == len(trained) == 6
    rejected = [s for i in (0, 1) for s in results[i] if s.outcome == "rejected"]
    assert len(rejected) == 6


class Regressing:
    """A gate that finds the candidate worse: significantly (interval below −margin) or not."""

    interval = [-0.6, -0.3]

    def evaluate(self, candidate, current, ctx):
        return Evaluation(evaluator="regressing", candidate_scores=[0.0], current_scores=[1.0], tasks=["t"],
                          metrics={"interval": list(self.interval), "margin": 0.05, "confidence": 0.95})

    def decide(self, evaluation):
        return Decision("reject", "worse")


class NotSignificantly(Regressing):
    interval = [-0.4, 0.02]


@pytest.mark.parametrize("gate", [Regressing, NotSignificantly])
def test_the_divergence_guard_resets_a_lineage_the_gate_finds_significantly_worse(tmp_path, gate):
    from reef_core.serve.metrics import Metrics

    add_plugin("recipe", "advancing", AdvancingRecipe)
    add_plugin("evaluator", "regressing", gate)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "regressing"})
    config["recipe"] = {"name": "advancing", "batch_size": 1}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    metrics = Metrics()
    reef.register(metrics, name="test.metrics")
    _seed(reef.store, scenario="default")
    [step] = grow_steps(reef, 1)
    assert step.outcome == "rejected"
    head = Lineages(tmp_path / "state").head("default")
    saved = reef.store.get_candidate(step.candidate_id).artifact["metadata"]["lineage"]
    resets = metrics.registry.get_sample_value("reef_lineage_resets_total",
                                               {"scenario": "default", "recipe": "advancing"}) or 0
    if gate is Regressing:
        assert head.checkpoint is None and "significantly worse than serving" in head.last_reset["reason"]
        assert "[-0.600, -0.300] entirely below -0.05" in saved["reset"] and resets == 1
    else:
        assert head.checkpoint is not None and head.last_reset is None and "reset" not in saved and resets == 0


class SkippingRecipe(NewRuleRecipe):
    keeps_lineage = True
    kind = "nothing_to_learn"

    def propose(self, batch, current, ctx):
        ctx.skip("nothing to learn: no reward", self.kind, rollouts_stale=2)
        return None


@pytest.mark.parametrize("kind,counted", [("nothing_to_learn", "nothing_to_learn"), ("made-up", "other")])
def test_a_skipped_step_says_why_and_is_counted(tmp_path, kind, counted):
    from reef_core.serve.metrics import Metrics

    add_plugin("recipe", "skipping", SkippingRecipe)
    SkippingRecipe.kind = kind
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "skipping", "batch_size": 1}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    metrics = Metrics()
    reef.register(metrics, name="test.metrics")
    _seed(reef.store, scenario="default")
    [step] = grow_steps(reef, 1)
    assert step.outcome == "skipped" and "from this batch: nothing to learn: no reward" in step.reason
    assert reef.store.get_candidate(step.candidate_id).reason == step.reason
    labels = {"scenario": "default", "recipe": "skipping"}
    assert metrics.registry.get_sample_value("reef_candidates_skipped_total", {**labels, "kind": counted}) == 1
    assert metrics.registry.get_sample_value("reef_lineage_rollouts_stale_total", labels) == 2


class LeaseLosingRecipe(NewRuleRecipe):
    """A lineage recipe that moves its head as the weight recipes do (``reef_train.lineage``,
    under the step's growth lease). On server a's first step, while it trains, a's lease
    expires (its process paused past the expiry) and server b runs a whole step meanwhile."""

    keeps_lineage = True
    #: server b's step, run while a's first step trains (set by the test)
    meanwhile = None

    def __init__(self, batch_size: int = 1, state_dir=None):
        super().__init__(batch_size)
        self.lineages = Lineages(state_dir)
        self.advanced: list[list[str]] = []

    def propose(self, batch, current, ctx):
        from reef_train import lineage

        head = lineage.continued_head(self.lineages, batch.scenario, current, ctx.log, ctx)
        cand = super().propose(batch, current, ctx)
        if LeaseLosingRecipe.meanwhile is not None and len(self.batches) == 1:
            run, LeaseLosingRecipe.meanwhile = LeaseLosingRecipe.meanwhile, None
            run()
        new = lineage.advance(self.lineages, batch.scenario, cand.artifact_dir, head=head, current=current, steps=1,
                              meta={}, ctx=ctx)
        self.advanced.append(batch.report_ids)
        return Candidate(scenario=cand.scenario, recipe=cand.recipe, artifact_dir=cand.artifact_dir,
                         summary=cand.summary, metadata={"lineage": lineage.candidate_metadata(new)})


def test_a_step_that_lost_the_growth_lease_never_advances_the_lineage(tmp_path, store_url):
    """Two servers on one store: a's step trains a batch, its lease expires meanwhile, b takes
    the lease over, settles a's candidate (interrupted: its batch returns to the pool) and
    trains that batch into its lineage. a's advance is then refused (the fencing token): the
    batch advances a lineage once, never twice."""
    import threading

    from sqlalchemy import text

    add_plugin("evaluator", "always_reject", AlwaysReject)
    add_plugin("recipe", "lease_losing", LeaseLosingRecipe)
    reefs = []
    for name in ("a", "b"):
        config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always_reject"})
        config["recipe"] = {"name": "lease_losing", "batch_size": 1}
        config["loop"].update(retry_after_new=0, max_attempts=3)
        config["record_store"] = {"url": store_url}
        (tmp_path / name).mkdir()
        settings = settings_for(tmp_path / name, Down, config, [f"artifact_store.path={tmp_path / 'artifacts.git'}"])
        reefs.append(build_reef(settings, get_plugins(), background=False))
    a, b = reefs
    _, rpt = _seed(a.store, scenario="default")
    b_steps: list = []

    def b_steps_meanwhile():
        with a.store._writer.begin() as conn:   # a's process is paused past its lease's expiry
            conn.execute(text("UPDATE growth_leases SET expires_at = 0"))
        thread = threading.Thread(target=lambda: b_steps.extend(grow_steps(b, 1)))
        thread.start()
        thread.join(timeout=120)

    LeaseLosingRecipe.meanwhile = b_steps_meanwhile
    [a_step] = grow_steps(a, 1)
    [b_step] = b_steps
    assert b_step.outcome == "rejected", b_step.reason
    assert a_step.outcome == "error" and "growth lease" in a_step.reason, a_step.reason
    advanced = [batch for r in reefs for batch in r.learning.plan("default").recipe.advanced]
    assert advanced == [[rpt]]                                   # the batch advanced one lineage once
    heads = {name: Lineages(tmp_path / name / "state").head("default") for name in ("a", "b")}
    assert heads["a"] is None and heads["b"].step == 1 and heads["b"].lease_token is not None


class BacklogRecipe(LineageRuleRecipe):
    """A lineage recipe whose step may take several waiting batches (``max_batches``)."""

    def __init__(self, batch_size: int = 1, max_batches: int = 1):
        super().__init__(batch_size)
        self.max_batches = max_batches


@pytest.mark.parametrize("max_batches,taken", [(1, [2, 2, 2, 1]), (2, [4, 2, 1]), (3, [6, 1]), (8, [6, 1])])
def test_a_step_takes_the_whole_batches_waiting_up_to_max_batches(tmp_path, store_url, max_batches, taken):
    add_plugin("evaluator", "always_reject", AlwaysReject)
    add_plugin("recipe", "backlog", BacklogRecipe)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always_reject"})
    config["recipe"] = {"name": "backlog", "batch_size": 2, "max_batches": max_batches}
    config["record_store"] = {"url": store_url}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    reports = [_seed(reef.store, f"q{i}", scenario="default")[1] for i in range(7)]
    steps = grow_steps(reef, len(taken) + 1)
    recipe = reef.learning.plan("default").recipe
    # whole batches, oldest first, at most max_batches of them; a manual step takes the odd one left
    assert [len(b) for b in recipe.batches] == taken
    assert [r for b in recipe.batches for r in b] == reports
    assert [s.outcome for s in steps] == ["rejected"] * len(taken) + ["nothing"]
    assert reef.learning.plan("default").describe()["max_batches"] == max_batches
