"""A night with a scripted evolver: grouping, parse fallbacks, merge on collision, the pool diff."""

from __future__ import annotations

import json

from skillclaw_doubles import ScriptedEvolver, decision, experience, record

from reef_recipe_skillclaw import NO_SKILL, Night, Skill, SkillPool, build_digest, group_by_skill, load_prompts
from reef_recipe_skillclaw.night import normalise


def _pool(**skills: tuple[str, str]) -> SkillPool:
    pool = SkillPool()
    for name, (description, body) in skills.items():
        pool.put(Skill(name, description, body))
    return pool


def _night(evolver: ScriptedEvolver) -> Night:
    return Night(evolver, load_prompts())


def test_grouping_by_skill_and_the_no_skill_bucket():
    pool = _pool(sums=("add numbers", "x"), csv=("read csv", "y"))
    read_by_tool = record("r1", "parse it", "done", tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "skills/csv/SKILL.md"}'}}])
    named_in_args = record("r2", "add", "5", tool_calls=[
        {"id": "c2", "type": "function", "function": {"name": "use_skill", "arguments": '{"skill": "sums"}'}}])
    digests = [build_digest(e, pool.names) for e in (
        experience(0, 1.0, records=(read_by_tool,)),
        experience(1, 0.0, records=(named_in_args,)),
        experience(2, 0.0, skills=["sums", "csv"]),
        experience(3, 1.0),
    )]
    groups = group_by_skill(digests)
    assert list(groups) == ["csv", "sums", NO_SKILL]
    assert [d.task_id for d in groups["csv"]] == ["rpt0", "rpt2"]
    assert [d.task_id for d in groups["sums"]] == ["rpt1", "rpt2"]
    assert [d.task_id for d in groups[NO_SKILL]] == ["rpt3"]
    # the catalogue the server injects counts as use only when asked to
    unread = build_digest(experience(4, 1.0), pool.names, catalogue_counts_as_use=True)
    assert unread.skills_read == ["csv", "sums"] and unread.skills_injected == ["csv", "sums"]


def test_digest_keeps_turns_tool_results_errors_and_session_turns():
    calls = [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]
    messages = [{"role": "system", "content": "harness"}, {"role": "user", "content": "list files"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "Error: permission denied"}]
    first = record("r1", "list files", "", session="s", seq=1, tool_calls=calls)
    last = record("r2", "", "I could not list them.", session="s", seq=2, messages=messages)
    d = build_digest(experience(0, 0.0, feedback={"text": "it failed"}, records=(last,), session_records=(first,)), [])
    assert d.record_ids == ["r1", "r2"] and d.session == "s"
    assert ("user", "list files") in d.turns and d.turns[-1] == ("assistant", "I could not list them.")
    assert d.tool_calls[0].name == "run" and d.tool_calls[0].error and "permission denied" in d.tool_calls[0].result
    assert d.feedback == "it failed" and d.reliable and d.score == 0.0
    assert "ERROR" in d.render() and "harness" not in d.render()


def test_the_unscored_sentinel_batches_and_is_judged_with_the_weights():
    evolver = ScriptedEvolver(judge=json.dumps({"task_completion": 1.0, "response_quality": 0.0, "efficiency": 0.0,
                                                "tool_usage": 0.0, "reason": "done but sloppy"}))
    digests = [build_digest(e, []) for e in (experience(0, -1.0), experience(1, None), experience(2, 0.5))]
    assert [d.reliable for d in digests] == [False, False, True]
    result = _night(evolver).run(digests, SkillPool())
    assert evolver.steps().count("judge") == 2 and evolver.steps().count("summarize") == 3
    assert result.judged["rpt0"]["overall"] == 0.55 and result.judged["rpt1"]["overall"] == 0.55
    assert "rpt2" not in result.judged
    assert digests[0].effective_score == 0.55 and digests[2].effective_score == 0.5
    # temperatures as the method specifies: summary 0.2, judge 0.1, decision 0.4
    temps = {step: t for step, _, t in evolver.calls}
    assert temps == {"summarize": 0.2, "judge": 0.1, "create": 0.4}


def test_parse_fallbacks():
    pool = _pool(sums=("add numbers", "old"))
    ids = ["rpt0"]
    fenced = "Here is my decision:\n```json\n" + decision("improve_skill", "sums", content="new text") + "\n```"
    evolver = ScriptedEvolver(decide=fenced)
    d = _night(evolver).decide("sums", [build_digest(experience(0, 0.0, skills=["sums"]), pool.names)], pool)
    assert d.action == "improve_skill" and d.content == "new text"
    # JSON inside prose, no fence
    assert normalise("sums", {"action": "skip"}, pool, ids).action == "skip"
    # a create without a name is a skip, and so is an unparseable reply or an unknown action
    assert normalise(NO_SKILL, {"action": "create_skill", "content": "x"}, pool, ids).action == "skip"
    assert normalise("sums", None, pool, ids).reason == "the reply held no JSON object"
    assert normalise("sums", {"action": "rewrite_all"}, pool, ids).action == "skip"
    assert normalise(NO_SKILL, {"action": "create_skill", "name": "bad name!", "content": "x"}, pool, ids).action == "skip"
    # the no-skill bucket can only create or skip
    assert normalise(NO_SKILL, {"action": "improve_skill", "content": "x"}, pool, ids).action == "skip"
    # a create named like the group's own skill is an improvement of it
    own = normalise("sums", {"action": "create_skill", "name": "sums", "content": "x"}, pool, ids)
    assert own.action == "improve_skill" and own.name == "sums"
    # improve and optimize edit the group's skill whatever name the reply gives
    assert normalise("sums", {"action": "optimize_description", "name": "other", "description": "d"}, pool,
                     ids).name == "sums"
    assert normalise("sums", {"action": "optimize_description"}, pool, ids).action == "skip"


def test_a_create_that_collides_is_merged_and_nothing_is_removed():
    base = _pool(sums=("add numbers", "Add the two numbers."), csv=("read csv", "Use the csv module."))
    merged = {"description": "add numbers; answer with the number only",
              "content": "Add the two numbers.\nAnswer with the number only, e.g. 3 + 4 -> 7."}
    evolver = ScriptedEvolver(
        create=decision("create_skill", "sums", "answer sums", "Answer with the number only."),
        merge=json.dumps(merged))
    digests = [build_digest(experience(0, 0.0), base.names)]
    result = _night(evolver).run(digests, base)
    assert "merge" in evolver.steps()
    merge_prompt = next(p for s, p, _ in evolver.calls if s == "merge")
    assert "Add the two numbers." in merge_prompt and "Answer with the number only." in merge_prompt
    assert result.pool.get("sums").body == merged["content"]
    assert result.rationale["sums"]["action"] == "merge"
    changes = result.pool.diff(base)
    assert [(c.op, c.name) for c in changes] == [("update", "sums")]
    assert result.pool.names == ["csv", "sums"]  # csv untouched, never removed


def test_a_merge_without_a_usable_reply_keeps_the_existing_skill():
    base = _pool(sums=("add numbers", "Add."))
    evolver = ScriptedEvolver(create=decision("create_skill", "sums", "d", "other"), merge="I cannot merge these.")
    result = _night(evolver).run([build_digest(experience(0, 0.0), base.names)], base)
    assert result.pool.diff(base) == [] and "merge" in result.decisions[0].reason


def test_diff_creates_and_updates_in_one_night():
    base = _pool(sums=("add numbers", "Add."))
    evolver = ScriptedEvolver(
        decide=decision("optimize_description", "sums", description="Use for every 'What is a + b?' question"),
        create=decision("create_skill", "units", "convert units", "Multiply by the factor."))
    digests = [build_digest(experience(0, 0.0, skills=["sums"]), base.names),
               build_digest(experience(1, 0.0, question="3 km in m?", answer="30"), base.names)]
    result = _night(evolver).run(digests, base)
    changes = result.pool.diff(base)
    assert [(c.op, c.name, c.fields) for c in changes] == [("update", "sums", ("description",)),
                                                            ("create", "units", ("description", "body"))]
    assert result.pool.get("sums").body == "Add."
    assert result.rationale["units"]["steps"][0]["sessions"] == ["rpt1"]


def test_skill_files_keep_front_matter_and_names_are_validated(tmp_path):
    pool = SkillPool()
    pool.put(Skill("sums", "Use for\nsums:   a + b", "Answer with the number only."))
    pool.write(tmp_path, ["sums"])
    text = (tmp_path / "skills" / "sums" / "SKILL.md").read_text()
    assert text.startswith("---\nname: sums\ndescription: Use for sums: a + b\n---\n")
    again = SkillPool.load(tmp_path)
    assert again.get("sums") == pool.get("sums")
    import pytest

    with pytest.raises(ValueError, match="invalid skill name"):
        pool.put(Skill("../etc", "d", "b"))


def test_a_report_naming_many_unknown_skills_makes_a_few_groups_not_one_each():
    """Each skill a session read is a group and each group an evolver call: a report naming 2,000
    skills the pool lacks made 2,000 calls. A few unknown names (valid ones) still count."""
    from reef_recipe_skillclaw.digest import MAX_UNKNOWN_SKILLS

    named = ["sums", "../etc", *(f"s{i}" for i in range(2000))]
    d = build_digest(experience(0, 0.0, skills=named), ["sums"])
    assert d.skills_read == ["sums", *(f"s{i}" for i in range(MAX_UNKNOWN_SKILLS))]
    assert len(group_by_skill([d])) == 1 + MAX_UNKNOWN_SKILLS
