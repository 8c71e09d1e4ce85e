"""Gate tasks drawn from a scenario's own scored traffic (``task_suite``'s ``traffic_tasks``).

A report that carries what its grader needs to score a fresh answer — ``pattern`` (the
``regex`` grader) or ``expected``, and optionally ``grader``, in its metadata, as the
reports ``bench/learning.py`` posts do — makes a task: the conversation of the last record
it quotes (the request as the client sent it, text only), graded as the report says. Both
sides answer it afresh, as they answer the configured tasks.

Never from what the candidate trained on: a report of its batch, a report quoting a record of
its batch, and a conversation whose user text is a user message of its batch (the
contamination check of ``reef_core.commit.tasks``) are left out; so are a report, or one
quoting a record, that a candidate which was not published holds or spent: a recipe that
keeps a lineage trained the lineage (whose snapshot the candidate is) on it, serving did not. The draw is a seeded sample
(the candidate id: the same candidate, the same tasks) of the usable reports among the
scenario's ``TRAFFIC_WINDOW`` newest.

The grader runs the report's pattern as a regular expression: whoever may post reports to
the scenario chooses it, so a pattern (or an ``expected`` answer) longer than
``MAX_PATTERN_CHARS`` is not used, and a match is cut after ``kit.graders.REGEX_TIMEOUT_S``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError
from ..kit.graders import regex_problem
from ..kit.records import chat_request
from ..kit.tasks import content_text
from .tasks import load_tasks, normalize_prompt, user_texts

#: how many of the scenario's newest reports the draw looks at
TRAFFIC_WINDOW = 1000
#: the longest report pattern a traffic task runs (a reporter's regular expression)
MAX_PATTERN_CHARS = 500
#: a report whose metadata is larger than this (as stored) is not read for a task
MAX_METADATA_BYTES = 16 * 1024
#: records read at a time while the draw looks for tasks
RECORDS_A_READ = 16
_ROLES = ("system", "developer", "user", "assistant")


def grading_of(metadata: Any, graders: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a report's metadata says a fresh answer is graded by (``grader`` with ``pattern``
    and/or ``expected``), checked as a task's would be; None when it says nothing usable."""
    if not isinstance(metadata, Mapping):
        return None
    grading = {k: metadata[k] for k in ("pattern", "expected", "grader")
               if isinstance(metadata.get(k), str) and metadata[k]}
    if not grading.get("pattern") and not grading.get("expected"):
        return None
    # any client with a report token writes these: bounded, whichever field a grader reads
    if len(grading.get("pattern") or "") > MAX_PATTERN_CHARS or len(grading.get("expected") or "") > MAX_PATTERN_CHARS:
        return None
    if grading.get("grader") == "regex" or (not grading.get("grader") and grading.get("pattern")):
        if regex_problem(grading.get("pattern") or grading["expected"]):
            return None
    try:  # the task loader's own checks: a known grader, and what it needs
        [task] = load_tasks([{"prompt": "-", **grading}], "contains", dict(graders))
    except ConfigError:
        return None
    return {k: task[k] for k in ("grader", "pattern", "expected") if task.get(k)}


def conversation(request: Any) -> list[dict[str, str]]:
    """A recorded request's messages as text-only chat messages (any route's body)."""
    out = []
    for m in chat_request(request).get("messages") or []:
        role, text = m.get("role"), content_text(m.get("content"))
        if role in _ROLES and text.strip():
            out.append({"role": role, "content": text})
    return out if any(m["role"] == "user" for m in out) else []


def traffic_tasks(store: Any, scenario: str, count: int, *, graders: Mapping[str, Any],
                  exclude_reports: Iterable[str], exclude_records: Iterable[str],
                  training_prompts: frozenset[str], seed: int) -> list[dict[str, Any]]:
    """Up to ``count`` tasks from ``scenario``'s scored traffic, none from what the candidate
    trained on (its reports, its records, its user texts); one per conversation."""
    if count <= 0 or store is None:
        return []
    reports_out, records_out = set(exclude_reports), set(exclude_records)
    usable = []
    # three columns of reports whose metadata a task's grading fits in: a reporter's megabytes of
    # feedback or metadata are never read here
    for report_id, references, meta in store.graded_report_rows(scenario, limit=TRAFFIC_WINDOW,
                                                                max_meta_bytes=MAX_METADATA_BYTES):
        refs = [str(r) for r in references or []]
        if report_id in reports_out or not refs or records_out.intersection(refs):
            continue
        grading = grading_of(meta, graders)
        if grading is not None:
            usable.append((report_id, refs, grading))
    # what a lineage trained on before this batch: an unpublished candidate's held or spent
    # experience (a recipe that keeps a lineage trains on every batch, whatever the verdict)
    trained = store.held_unpublished([i for report_id, refs, _ in usable for i in (report_id, *refs)])
    usable = [(report_id, refs[-1], grading) for report_id, refs, grading in usable
              if report_id not in trained and not trained.intersection(refs)]
    # the records a few at a time (their bodies may be megabytes each), newest report first: a
    # conversation asked again is the task of its newest report
    tasks: dict[tuple[str, ...], dict[str, Any]] = {}
    for start in range(0, len(usable), RECORDS_A_READ):
        chunk = usable[start:start + RECORDS_A_READ]
        records = store.get_records({rid for _, rid, _ in chunk})
        for report_id, record_id, grading in chunk:
            record = records.get(record_id)
            messages = conversation(record.request) if record is not None else []
            said = tuple(normalize_prompt(t) for t in user_texts({"messages": messages}))
            if not said or any(t in training_prompts for t in said) or said in tasks:
                continue
            tasks[said] = {"id": f"traffic:{report_id}", "messages": messages, **grading}
    drawn = list(tasks.values())
    random.Random(seed).shuffle(drawn)
    return drawn[:count]
