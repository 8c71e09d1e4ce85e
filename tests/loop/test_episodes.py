"""Every evaluation episode is stored with its candidate, compactly, in the transaction that
records the verdict; the candidate route, ``reef candidates show`` and the store read them
back as they were. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from reef_core.cli import main
from reef_core.store import CandidateRow, RecordStore
from reef_core.testing import ReefServer
from reef_core.types import Decision, Episode, Evaluation

from .conftest import add_plugin, feedback_rules_config, settings_for, write_config
from .test_experience_return import Down, NewRuleRecipe, _seed

HARNESS = ("You are the support assistant of Acme Corp. Answer briefly and in the user's language.\n\n# Rules\n"
           + "\n".join(f"- Rule {i}: do the thing number {i} the customer asked about, explicitly." for i in range(12)))


def _episodes(tasks: int = 5, repeats: int = 2, *, candidate_wins: bool = True) -> list[Episode]:
    out = []
    for t in range(tasks):
        for r in range(repeats):
            for side in ("candidate", "current"):
                system = HARNESS if side == "candidate" else HARNESS[:200]
                body = {"model": "m", "temperature": 0.7,
                        "messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": f"What is the capital of country {t}?"}]}
                won = (side == "candidate") == candidate_wins
                out.append(Episode(task_id=f"task-{t}", side=side, repeat=r, request=body,
                                   answer=f"City {t}" if won else "I am not sure.", score=1.0 if won else 0.0,
                                   grader="contains", latency_ms=10.0 + t))
    return out


@pytest.fixture
def store(store_url):
    s = RecordStore(store_url)
    yield s
    s.close()


def test_episodes_round_trip_compactly(store):
    store.add_candidate(CandidateRow(id="cand_1", scenario="s", recipe="r", status="evaluating"))
    episodes = _episodes()
    episodes.append(Episode(task_id="odd\x00id", side="candidate", repeat=0, request={"messages": []},
                            answer="nul\x00here", score=math.nan, grader="g", latency_ms=1.0, error="boom"))
    store.update_candidate("cand_1", status="rejected", decision="reject", episodes=episodes)
    got = store.list_episodes("cand_1")
    assert [g["position"] for g in got] == list(range(len(episodes)))
    for g, e in zip(got[:-1], episodes[:-1]):
        assert {k: v for k, v in g.items() if k != "position"} == e.to_dict()
    assert got[-1]["score"] is None and got[-1]["answer"] == "nul\ufffdhere" and got[-1]["task_id"] == "odd\ufffdid"
    assert store.episode_counts(["cand_1", "cand_none"]) == {"cand_1": len(episodes)}

    page = store.list_episodes("cand_1", after=6, limit=3)  # their dictionaries are read from outside the page
    assert [g["position"] for g in page] == [7, 8, 9] and page[0]["request"] == episodes[7].request

    from sqlalchemy import func, select

    from reef_core.store import EpisodeRow

    with store._reader.connect() as conn:
        stored = conn.execute(select(func.sum(func.length(EpisodeRow.request)))
                              .where(EpisodeRow.candidate_id == "cand_1")).scalar()
    raw = sum(len(json.dumps(e.request).encode()) for e in episodes)
    # the harness every request of a side repeats is stored about once per side
    assert stored * 8 < raw, (stored, raw)


class EpisodicEvaluator:
    """Keeps its episodes; the candidate wins while ``EpisodicEvaluator.win`` is true."""

    win = True

    def evaluate(self, candidate, current, ctx):
        episodes = _episodes(3, 2, candidate_wins=self.win)
        return Evaluation(evaluator="episodic", tasks=[e.task_id for e in episodes if e.side == "candidate"],
                          candidate_scores=[e.score for e in episodes if e.side == "candidate"],
                          current_scores=[e.score for e in episodes if e.side == "current"], episodes=episodes)

    def decide(self, evaluation):
        better = sum(evaluation.candidate_scores) > sum(evaluation.current_scores)
        return Decision("select" if better else "reject", "better" if better else "not better")


def _config(store_url: str) -> dict:
    add_plugin("recipe", "new_rule", NewRuleRecipe)
    add_plugin("evaluator", "episodic", EpisodicEvaluator)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "episodic"})
    config["recipe"] = {"name": "new_rule", "batch_size": 1}
    config["record_store"] = {"url": store_url}
    return config


def _grow(client) -> dict:
    r = client.post("/reef/scenarios/default/grow")
    assert r.status_code == 200, r.text
    return r.json()


def test_stored_episodes_match_the_decision(tmp_path, store_url):
    EpisodicEvaluator.win = True
    with ReefServer(tmp_path, settings=settings_for(tmp_path, Down, _config(store_url))) as server:
        client = server.client()
        _seed(server.store, "first", scenario="default")
        won = _grow(client)
        EpisodicEvaluator.win = False
        _seed(server.store, "second", scenario="default")
        lost = _grow(client)
        assert (won["outcome"], lost["outcome"]) == ("published", "rejected")

        for step in (won, lost):
            detail = client.get(f"/reef/scenarios/default/candidates/{step['candidate_id']}").json()
            listed = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            assert detail["candidate"] == next(c for c in listed if c["id"] == step["candidate_id"])
            episodes = detail["episodes"]
            assert detail["episodes_stored"] == len(episodes) == 12 and detail["next_cursor"] is None
            evaluation = detail["candidate"]["evaluation"]
            assert [e["score"] for e in episodes if e["side"] == "candidate"] == evaluation["candidate_scores"]
            assert [e["score"] for e in episodes if e["side"] == "current"] == evaluation["current_scores"]
            assert [e["task_id"] for e in episodes if e["side"] == "candidate"] == evaluation["tasks"]
            cand = sum(e["score"] for e in episodes if e["side"] == "candidate")
            cur = sum(e["score"] for e in episodes if e["side"] == "current")
            assert detail["candidate"]["decision"] == ("select" if cand > cur else "reject")
            assert episodes[0]["request"]["messages"][0]["content"] == HARNESS
        assert client.get(f"/reef/scenarios/default/candidates/{won['candidate_id']}").json()["experience"] == {
            "reports": {"held": 1}, "records": {"held": 1}}
        assert client.get(f"/reef/scenarios/default/candidates/{lost['candidate_id']}").json()["experience"] == {
            "reports": {"returned": 1}, "records": {"returned": 1}}


def test_candidate_route_pages_episodes(tmp_path, store_url):
    EpisodicEvaluator.win = False
    with ReefServer(tmp_path, settings=settings_for(tmp_path, Down, _config(store_url))) as server:
        client = server.client()
        _seed(server.store, "first", scenario="default")
        cid = _grow(client)["candidate_id"]
        url = f"/reef/scenarios/default/candidates/{cid}"
        seen, cursor = [], None
        while True:
            page = client.get(url, params={"limit": 5, **({"cursor": cursor} if cursor else {})}).json()
            seen += page["episodes"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [e["position"] for e in seen] == list(range(12))
        assert seen == client.get(url, params={"limit": 1000}).json()["episodes"]

        for bad in ("nope", "eyJzIjogMSwgImQiOiAxfQ"):  # garbage; a records cursor (newest first)
            r = client.get(url, params={"cursor": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "cursor", r.text
        assert client.get("/reef/scenarios/default/candidates/cand_nope").status_code == 404
        assert client.get(f"/reef/scenarios/other/candidates/{cid}").status_code == 404
        assert client.get(url, params={"limit": 0}).status_code == 422


def test_reef_candidates_show(tmp_path):
    EpisodicEvaluator.win = False
    store_url = f"sqlite:///{tmp_path / 'state' / 'reef.db'}"
    with ReefServer(tmp_path, settings=settings_for(tmp_path, Down, _config(store_url))) as server:
        _seed(server.store, "first", scenario="default")
        cid = _grow(server.client())["candidate_id"]
    cfg = write_config(tmp_path / "cli.yaml", _config(store_url))

    def show(*args: str):
        return CliRunner().invoke(main, ["candidates", "show", *args, "-c", str(cfg),
                                         f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={Down.url}"])

    table = show(cid)
    assert table.exit_code == 0, table.output
    assert f"candidate {cid} of default (new_rule): rejected — not better" in table.output
    assert "reports: 1 returned" in table.output
    assert "task-2" in table.output and "I am not sure." in table.output and "City 1" in table.output

    data = json.loads(show(cid, "--json").output)
    assert data["candidate"]["id"] == cid and len(data["episodes"]) == 12
    assert data["episodes"][0]["request"]["messages"][0]["content"] == HARNESS

    missing = show(cid, "-s", "other")
    assert missing.exit_code == 1 and f"no candidate {cid!r} in scenario 'other'" in missing.output

    export = CliRunner().invoke(main, ["candidates", "export", "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                       f"runtime.upstream_url={Down.url}"])
    assert export.exit_code == 0, export.output
    [line] = export.output.splitlines()
    exported = json.loads(line)
    assert exported["candidate"]["id"] == cid and exported["episodes"] == data["episodes"]
    assert exported["experience"] == data["experience"]


def test_task_suite_episodes_are_stored_with_the_verdict(tmp_path):
    from reef_core.testing import FakeUpstream

    from .conftest import GOOD_FEEDBACK, ask, capital_model, report

    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, loop_enabled=False))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            for feedback in (GOOD_FEEDBACK, "Answer in a friendly tone"):
                r = ask(client, "What is the capital of Italy?")
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=feedback)
                step = _grow(client)
                detail = client.get(f"/reef/scenarios/default/candidates/{step['candidate_id']}",
                                    params={"limit": 1000}).json()
                evaluation, episodes = detail["candidate"]["evaluation"], detail["episodes"]
                assert detail["episodes_stored"] == len(episodes) == 2 * len(evaluation["candidate_scores"]) > 0
                for side in ("candidate", "current"):
                    assert [e["score"] for e in episodes if e["side"] == side] == evaluation[f"{side}_scores"]
                cand = next(e for e in episodes if e["side"] == "candidate")
                assert cand["request"]["messages"][-1]["content"] == "What is the capital of France?"
                if step["outcome"] == "published":
                    assert GOOD_FEEDBACK in cand["request"]["messages"][0]["content"]
                    assert cand["answer"] == "The capital is Paris."
                    assert detail["experience"]["reports"] == {"held": 1}
                else:
                    assert step["outcome"] == "rejected"
                    assert detail["experience"]["reports"] == {"returned": 1}
