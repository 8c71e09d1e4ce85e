"""``reef_core.kit.tasks``: a held-out task as a request body in either dialect, and the text of
a message's content. ``task_suite`` and the gepa recipe send tasks through this one function."""

from __future__ import annotations

import copy

import pytest

from reef_core.kit import content_text, task_body
from reef_core.kit.tasks import ANTHROPIC_MAX_TOKENS


@pytest.mark.parametrize("content, text", [
    ("plain", "plain"),
    (None, ""),
    ([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "input_text",
                                                                                          "text": "b"}], "a\nb"),
    ([{"text": "untyped part"}, "bare string", {"type": "tool_use", "name": "f"}], "untyped part\nbare string"),
    (7, "7"),
])
def test_content_text(content, text):
    assert content_text(content) == text


def test_openai_body_puts_the_system_first_and_params_last():
    task = {"prompt": "U", "system": "T"}
    body = task_body(task, "openai", "m", {"temperature": 0, "model": "other"})
    assert body == {"model": "other", "messages": [{"role": "system", "content": "T"}, {"role": "user", "content": "U"}],
                    "temperature": 0}


def test_anthropic_body_joins_every_instruction_into_system():
    task = {"system": "T", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
        {"role": "developer", "content": "D"},
        {"role": "user", "content": "U"}]}
    body = task_body(task, "anthropic", "m", {"temperature": 0})
    assert body["system"] == "T\n\nS1\nS2\n\nD"
    assert body["messages"] == [{"role": "user", "content": "U"}]
    assert body["max_tokens"] == ANTHROPIC_MAX_TOKENS and body["temperature"] == 0
    assert "system" not in task_body({"prompt": "U"}, "anthropic", "m", {})
    assert task_body({"prompt": "U"}, "anthropic", "m", {"max_tokens": 8})["max_tokens"] == 8


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_the_body_shares_nothing_with_the_task(dialect):
    task = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "system": "T"}
    before = copy.deepcopy(task)
    body = task_body(task, dialect, "m", {})
    body["messages"][-1]["content"] = "changed by a runtime"
    body["messages"].append({"role": "assistant", "content": "x"})
    assert task == before


def test_task_suite_sends_tasks_through_the_kit():
    from reef_core.commit import tasks

    assert tasks.task_body is task_body
