"""What the dashboard derives from the API's answers: evaluation rows, recipe metadata, answers
and token counts of every route's records."""

from __future__ import annotations

from reef_core.ui import summaries


def test_evaluation_table_per_task_with_crashed_episodes():
    evaluation = {"tasks": ["a", "a", "b", "b"], "candidate_scores": [1.0, 0.0, 0.0, 0.0],
                  "current_scores": [0.0, 0.0, 1.0, None]}
    episodes = [{"task_id": "a", "side": "candidate", "error": None}, {"task_id": "a", "side": "current", "error": None},
                {"task_id": "b", "side": "candidate", "error": None}, {"task_id": "b", "side": "current", "error": "boom"}]
    a, b = summaries.evaluation_table(evaluation, episodes)
    assert (a.task, a.candidate, a.current, a.outcome, a.crashed_candidate) == ("a", 0.5, 0.0, "win", 0)
    assert (b.task, b.candidate, b.current, b.outcome, b.crashed_current) == ("b", 0.0, 1.0, "loss", 1)
    assert summaries.evaluation_table(None, []) == []


def test_recipe_metadata_rules_skills_and_training_metrics():
    rules = summaries.recipe_metadata({"metadata": {"added_rules": ["Be brief."], "rules": 3}})
    assert rules["rules"] == ["Be brief."] and rules["other"] == {"rules": 3}
    skills = summaries.recipe_metadata({"metadata": {"skillclaw": {
        "changes": [{"op": "add", "name": "cite", "fields": ["body"]}],
        "rationale": {"cite": {"action": "add", "steps": ["users asked for sources"]}}}}})
    assert skills["skills"] == [{"op": "add", "name": "cite", "fields": ["body"],
                                 "rationale": {"action": "add", "steps": ["users asked for sources"]}}]
    weights = summaries.recipe_metadata({"metadata": {"sao": {"mode": "lora", "metrics": {"loss": 0.25, "steps": 8}}}})
    assert weights["metrics"] == {"sao.loss": 0.25, "sao.steps": 8}
    assert summaries.recipe_metadata(None) == {"rules": [], "skills": [], "metrics": {}, "other": {}}


def test_answers_and_token_counts_of_every_route():
    chat = {"choices": [{"message": {"content": "hi"}}]}
    messages = {"content": [{"type": "text", "text": "hello"}, {"type": "tool_use", "name": "x"}]}
    responses = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "hey"}]}]}
    assert [summaries.answer_text(b) for b in (chat, messages, responses, None)] == ["hi", "hello", "hey", ""]
    assert summaries.token_count({"usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}) == \
        {"prompt": 3, "completion": 2, "total": 5}
    assert summaries.token_count({"usage": None, "prompt_token_ids": [1, 2], "response_token_ids": [3]}) == \
        {"prompt": 2, "completion": 1, "total": 3}


def test_diff_lines_are_classified():
    diff = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n keep\n-old\n+new"
    assert [k for k, _ in summaries.diff_lines(diff)] == ["file", "file", "file", "hunk", "ctx", "del", "add"]
    assert summaries.diff_lines(None) == []
