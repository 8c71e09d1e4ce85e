"""Triggers and concurrency: serving never waits for a growth step, one step per scenario at a
time, the schedule, and releases published by another process (the CLI) hot-swapped in."""

from __future__ import annotations

import subprocess
import sys
import threading

from reef_core import hookimpl
from reef_core.testing import FakeUpstream, ReefServer
from reef_core.types import Decision, Evaluation

from .conftest import (
    GOOD_FEEDBACK,
    add_plugin,
    ask,
    capital_model,
    feedback_rules_config,
    report,
    settings_for,
    wait_for,
    wait_published,
    write_config,
)


class GatedEvaluator:
    """Selects, but only once the test opens the gate."""

    gate = threading.Event()
    entered = threading.Event()

    def evaluate(self, candidate, current, ctx):
        type(self).entered.set()
        type(self).gate.wait(30)
        return Evaluation(evaluator="gated")

    def decide(self, evaluation):
        return Decision("select", "the gate opened")


def test_serving_continues_while_a_step_runs_and_steps_do_not_overlap(tmp_path):
    add_plugin("evaluator", "gated", GatedEvaluator)
    GatedEvaluator.gate.clear()
    GatedEvaluator.entered.clear()
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "gated"})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            r = ask(client, "What is the capital of Japan?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            results = {}
            step = threading.Thread(target=lambda: results.update(
                first=client.post("/reef/scenarios/default/grow")))
            step.start()
            try:
                assert GatedEvaluator.entered.wait(30)
                assert client.get("/reef/scenarios/default").json()["loop"]["state"] == "running"
                during = ask(client, "What is the capital of Japan?")
                assert during.json()["choices"][0]["message"]["content"] == "I am not sure."
                busy = client.post("/reef/scenarios/default/grow")
                assert busy.status_code == 409 and busy.json()["outcome"] == "busy"
            finally:
                GatedEvaluator.gate.set()
                step.join(30)
            assert results["first"].json()["outcome"] == "published"
            assert client.get("/reef/scenarios/default").json()["loop"]["state"] == "idle"
            after = ask(client, "What is the capital of Japan?")
            assert after.json()["choices"][0]["message"]["content"] == "The capital is Tokyo."


def test_the_schedule_grows_batches_that_no_report_triggered(tmp_path):
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"})
    config["loop"]["schedule_s"] = 0.2
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, config)
        with ReefServer(tmp_path, settings=settings) as server:
            lp = server.reef.learning
            # a report stored behind the server's back (no report_stored event): only the schedule sees it
            from reef_core.store import Record, Report, new_id

            rec = Record(id=new_id("rec"), scenario="default", request={"messages": []}, response={})
            server.store.add_record(rec)
            server.store.add_report(Report(id=new_id("rpt"), scenario="default", score=0.0, feedback="Be brief",
                                           references=[rec.id], body_hash="h"))
            step = wait_for(lambda: "default" in lp.workers and lp.workers["default"].last_step,
                            "a scheduled step")
            assert step.trigger == "auto" and step.outcome == "published"
            assert server.store.head_release("default").release_id == step.release_id


class _Announced:
    """An in-process plugin recording the releases announced as published."""

    def __init__(self, ids: list):
        self.ids = ids

    @hookimpl
    def release_published(self, release):
        self.ids.append(release.release_id)


def test_a_cli_rollback_is_followed_by_the_running_server(tmp_path):
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"})
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, config)
        with ReefServer(tmp_path, settings=settings) as server:
            announced = []
            server.reef.register(_Announced(announced))
            client = server.client()
            for n, feedback in enumerate(["Be brief", GOOD_FEEDBACK], 1):
                r = ask(client, f"q{n}")
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=feedback)
                wait_published(client, n)
            first = server.store.list_releases("default")[-1]
            assert ask(client, "What is the capital of Japan?").json()["choices"][0]["message"]["content"] \
                == "The capital is Tokyo."

            cfg = write_config(tmp_path / "cli.yaml", config)
            cli = subprocess.run([sys.executable, "-m", "reef_core", "rollback", "-s", "default", first.release_id,
                                  "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                  f"runtime.upstream_url={up.url}"], capture_output=True, text=True, timeout=120)
            assert cli.returncode == 0, cli.stderr
            assert "rollback to " + first.release_id in cli.stdout
            head = server.store.head_release("default")
            assert head.operation == "rollback" and head.content_hash == first.content_hash
            wait_for(lambda: head.release_id in announced, "the server to follow the CLI's release")
            assert server.reef.serving_release("default").release_id == head.release_id
            assert announced == [r.release_id for r in reversed(server.store.list_releases("default"))]
            r = ask(client, "What is the capital of Japan?")
            assert r.headers["x-reef-release-id"] == head.release_id
            assert r.json()["choices"][0]["message"]["content"] == "I am not sure."


def test_a_server_without_a_learning_loop_still_serves_follows_and_rolls_back(tmp_path):
    """Serving releases is the kernel's service: no learning loop is needed to serve a release
    published elsewhere, to follow it, or to roll back; growing is refused with a 409."""
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"})
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, config)
        with ReefServer(tmp_path, settings=settings) as learner:  # publishes one release, then stops
            client = learner.client()
            r = ask(client, "q1")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            wait_published(client, 1)
        with ReefServer(tmp_path, settings=settings, learning=False) as server:
            assert server.reef.learning is None
            announced = []
            server.reef.register(_Announced(announced))
            client = server.client()
            [first] = server.store.list_releases("default")
            r = ask(client, "What is the capital of Japan?")
            assert r.headers["x-reef-release-id"] == first.release_id  # recovered and served at start
            assert r.json()["choices"][0]["message"]["content"] == "The capital is Tokyo."

            grown = client.post("/reef/scenarios/default/grow")
            assert grown.status_code == 409 and "without a learning loop" in grown.json()["error"]["message"]
            status = client.get("/reef/scenarios/default").json()
            assert status["loop"] is None and status["serving_release_id"] == first.release_id

            rolled = client.post("/reef/scenarios/default/rollback", json={"to": "base"})  # first is the head
            assert rolled.status_code == 200 and rolled.json()["published"], rolled.text
            rolled_id = rolled.json()["release"]["release_id"]
            assert announced == [rolled_id]
            assert server.reef.serving_release("default").release_id == rolled_id

            cfg = write_config(tmp_path / "cli.yaml", config)
            cli = subprocess.run([sys.executable, "-m", "reef_core", "rollback", "-s", "default", first.release_id,
                                  "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                  f"runtime.upstream_url={up.url}"], capture_output=True, text=True, timeout=120)
            assert cli.returncode == 0, cli.stderr
            head = server.store.head_release("default")
            wait_for(lambda: head.release_id in announced, "the server to follow the CLI's release")
            assert ask(client, "hi").headers["x-reef-release-id"] == head.release_id
            assert server.app.state.serve.dead_workers() == []
