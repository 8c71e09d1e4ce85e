"""The whole loop over HTTP: failing answers → feedback → feedback_rules → task_suite →
release → the next request carries the new rules, without a restart."""

from __future__ import annotations

import subprocess

from reef_core.testing import FakeUpstream, ReefServer, system_prompt

from .conftest import (
    GOOD_FEEDBACK,
    ask,
    capital_model,
    feedback_rules_config,
    report,
    settings_for,
    wait_for,
    wait_published,
)


def test_feedback_becomes_a_rule_that_serves_the_next_request(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=2))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            first = ask(client, "What is the capital of Italy?")
            assert first.json()["choices"][0]["message"]["content"] == "I am not sure."
            assert "x-reef-release-id" not in first.headers
            second = ask(client, "Capital of Italy, please?")
            report(client, [first.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            report(client, [second.headers["x-reef-agent-record-id"]], score=0.0,
                   feedback={"text": "  - always NAME the capital city explicitly!  "})

            releases = wait_published(client, 1)
            assert len(releases) == 1 and releases[0]["operation"] == "train"
            release_id = releases[0]["release_id"]

            up.reset()
            third = ask(client, "What is the capital of Italy?")
            assert third.headers["x-reef-release-id"] == release_id
            assert third.json()["choices"][0]["message"]["content"] == "The capital is Rome."
            assert GOOD_FEEDBACK in system_prompt(up.requests[-1])
            record = server.store.get_record(third.headers["x-reef-agent-record-id"])
            assert record.release_id == release_id
            assert GOOD_FEEDBACK in record.request["messages"][0]["content"]

            detail = client.get(f"/reef/scenarios/default/releases/{release_id}").json()
            assert detail["manifest"]["content_hash"] == releases[0]["content_hash"]
            assert f"+- {GOOD_FEEDBACK}." in detail["diff"]
            assert detail["evaluation"]["metrics"]["wins"] == 2
            assert detail["candidate"]["status"] == "published"
            # the two feedbacks say the same thing: one rule
            assert detail["diff"].count("+- ") == 1

            candidates = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            assert [c["status"] for c in candidates] == ["published"]
            assert candidates[0]["decision"] == "select"
            # 2 tasks × 5 repeats: the requests set no temperature, so the runtime's default samples
            assert candidates[0]["evaluation"]["candidate_scores"] == [1.0] * 10
            assert candidates[0]["evaluation"]["current_scores"] == [0.0] * 10

            metrics = client.get("/metrics").text
            assert ('reef_candidates_evaluated_total{outcome="select",recipe="feedback_rules",scenario="default"} 1.0'
                    in metrics)

            # the step's result is visible a moment before it lets go of its lease and lock
            loop = wait_for(lambda: (lp := client.get("/reef/scenarios/default").json()["loop"])["state"] == "idle"
                            and lp, "the loop idle after its step")
            assert loop["recipe"] == "feedback_rules" and loop["evaluator"] == "task_suite"
            assert loop["serving_release_id"] == release_id
            assert loop["last_step"]["outcome"] == "published"
            assert loop["eligible"] == 0 and loop["state"] == "idle"
            r = ask(client, "One more?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback="Be brief")
            assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 1


def test_harness_routes_and_install_script(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            assert client.get("/reef/harness").status_code == 404
            r = ask(client, "What is the capital of France?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.1, feedback=GOOD_FEEDBACK)
            wait_published(client, 1)

            tree = client.get("/reef/harness")
            assert tree.status_code == 200
            files = {f["path"]: f for f in tree.json()["files"]}
            assert list(files) == ["rules.md"]
            assert files["rules.md"]["content"] == f"- {GOOD_FEEDBACK}.\n"
            head = client.get("/reef/scenarios/default/releases").json()["head_release_id"]
            assert tree.headers["x-reef-release-id"] == head

            script = client.get("/reef/harness/install", params={"adapter": "files"})
            assert script.status_code == 200 and script.headers["x-reef-release-id"] == head
            assert client.get("/reef/harness/install", params={"adapter": "nope"}).status_code == 404

    path = tmp_path / "install.sh"
    path.write_text(script.text)
    dest = tmp_path / "harness"
    once = subprocess.run(["sh", str(path), str(dest)], capture_output=True, text=True)
    assert once.returncode == 0, once.stderr
    assert (dest / "rules.md").read_text() == f"- {GOOD_FEEDBACK}.\n"
    assert subprocess.run(["sha256sum", "-c", ".reef-harness.sha256"], cwd=dest, capture_output=True).returncode == 0
    twice = subprocess.run(["sh", str(path), str(dest)], capture_output=True, text=True)
    assert twice.returncode == 0 and "already current" in twice.stdout

    (dest / "rules.md").write_text("- something else\n")
    tampered = subprocess.run(["sh", str(path), str(dest)], capture_output=True, text=True)
    assert tampered.returncode == 1 and "changed since it was installed" in tampered.stderr
    assert (dest / "rules.md").read_text() == "- something else\n"

    damaged = tmp_path / "damaged.sh"
    damaged.write_text(script.text.replace(f"- {GOOD_FEEDBACK}.", "- Always answer in French."))
    other = tmp_path / "other"
    bad = subprocess.run(["sh", str(damaged), str(other)], capture_output=True, text=True)
    assert bad.returncode == 1 and "checksum mismatch for rules.md" in bad.stderr
    assert not other.exists()


def test_rollback_route_republishes_old_content(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}),
                                overrides=["auth.tokens=[{token: adm, role: admin}, {token: rd, role: report}]"])
        with ReefServer(tmp_path, settings=settings, token="adm") as server:
            client = server.client()
            for n, feedback in enumerate(["Be brief", "Cite sources"], 1):
                r = ask(client, f"question {n}")
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=feedback)
                wait_published(client, n)
            first, second = reversed(client.get("/reef/scenarios/default/releases").json()["releases"])

            reader = server.client(token="rd")
            assert reader.post("/reef/scenarios/default/rollback",
                               json={"release_id": first["release_id"]}).status_code == 403
            assert reader.post("/reef/scenarios/default/grow").status_code == 403
            assert reader.get("/reef/scenarios/default/releases").status_code == 200
            assert server.client(token="wrong").get("/reef/harness").status_code == 401
            assert client.post("/reef/scenarios/default/rollback",
                               json={"release_id": "rel_nope"}).status_code == 404

            r = client.post("/reef/scenarios/default/rollback", json={"release_id": first["release_id"]})
            assert r.status_code == 200, r.text
            third = r.json()["release"]
            assert third["operation"] == "rollback" and third["sequence"] == 3
            assert third["content_hash"] == first["content_hash"] != second["content_hash"]
            chain = client.get("/reef/scenarios/default/releases").json()
            assert [x["release_id"] for x in chain["releases"]] == [third["release_id"], second["release_id"],
                                                                      first["release_id"]]
            assert chain["serving_release_id"] == third["release_id"]
            served = ask(client, "question 3")
            assert served.headers["x-reef-release-id"] == third["release_id"]
            assert "Cite sources" not in system_prompt(up.requests[-1])
            assert "Be brief" in system_prompt(up.requests[-1])


def test_an_agent_installed_before_the_first_release_is_pointed_at_reef_and_updated_later(tmp_path):
    """A new scenario has no release: the agent installer still writes its settings (an empty
    harness, release ``none``), so the agent's first requests can become the first experience;
    ``reef agent update`` installs the first release once it serves."""
    from reef_core.cli import agent as cli_agent

    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            project = tmp_path / "project"
            project.mkdir()
            out = cli_agent.install("claude", project, url=server.url, scenario="default")
            assert "installed release none" in out
            assert cli_agent.installed(project, "claude")["release_id"] == "none"
            claude_settings = (project / ".claude" / "settings.json").read_text()
            assert server.url in claude_settings and "x-reef-scenario" in claude_settings
            assert "already current" in cli_agent.update("claude", project, url=server.url, scenario=None)

            client = server.client()
            r = ask(client, "What is the capital of France?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.1, feedback=GOOD_FEEDBACK)
            head = wait_published(client, 1)[0]["release_id"]
            assert "installed release" in cli_agent.update("claude", project, url=server.url, scenario=None)
            assert cli_agent.installed(project, "claude")["release_id"] == head
            assert GOOD_FEEDBACK in (project / "CLAUDE.md").read_text()
