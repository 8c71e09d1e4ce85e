"""One night: the day's session digests become edits of the skill pool.

Each step is an evolver call (prompts in ``prompts/``, overridable by file name):

1. summarise each session into a short causal analysis (temperature 0.2);
2. judge the sessions without a reliable score on four dimensions, weighted into one score
   (temperature 0.1);
3. group the sessions by the skill they used, plus the no-skill bucket;
4. decide per group (temperature 0.4, at most ``max_sessions`` sessions shown):
   ``improve_skill``, ``optimize_description``, ``create_skill`` or ``skip``; the no-skill
   bucket can only create or skip;
5. apply the decisions to a scratch pool; a created name that collides with an existing skill
   is merged with it by another call (temperature 0.3); nothing is removed.

A reply that cannot be parsed, or a call that still fails after its retries, makes that step a
skip (a summary falls back to the digest, a judge leaves the score unknown); the night goes on.
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .digest import NO_SKILL, SessionDigest, group_by_skill
from .evolver import Evolver, EvolverError, parse_json
from .pool import Skill, SkillPool, one_line, valid_name

log = logging.getLogger("reef.recipe.skillclaw")

ACTIONS = ("improve_skill", "optimize_description", "create_skill", "skip")
PROMPTS = ("summarize", "judge", "decide", "create", "merge")
DIMENSIONS = ("task_completion", "response_quality", "efficiency", "tool_usage")
DEFAULT_WEIGHTS = {"task_completion": 0.55, "response_quality": 0.30, "efficiency": 0.05, "tool_usage": 0.10}


def load_prompts(override_dir: str | Path | None = None) -> dict[str, string.Template]:
    """The prompt templates (``$name`` placeholders): the package's ``prompts/<step>.md``, each
    replaced by a file of the same name in ``override_dir`` when there is one."""
    out = {}
    base = resources.files(__package__) / "prompts"
    for step in PROMPTS:
        path = Path(override_dir) / f"{step}.md" if override_dir else None
        text = path.read_text(encoding="utf-8") if path is not None and path.is_file() else \
            (base / f"{step}.md").read_text(encoding="utf-8")
        out[step] = string.Template(text)
    return out


@dataclass
class Decision:
    """What the night decided for one group, normalised (``reason`` says why a reply became a skip)."""

    group: str
    action: str
    name: str = ""
    description: str = ""
    content: str = ""
    fault: str = ""
    rationale: str = ""
    reason: str = ""
    sessions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group or "(no skill)", "action": self.action, "name": self.name or None,
                "fault": self.fault or None, "rationale": self.rationale, "note": self.reason or None,
                "sessions": self.sessions}


@dataclass
class NightResult:
    pool: SkillPool
    decisions: list[Decision]
    #: per changed skill: what was done to it and why
    rationale: dict[str, dict[str, Any]]
    judged: dict[str, dict[str, Any]]
    summaries: dict[str, str]


@dataclass
class Night:
    evolver: Evolver
    prompts: dict[str, string.Template]
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    max_sessions: int = 30
    digest_chars: int = 4000
    summary_max_tokens: int = 600
    judge_max_tokens: int = 1200
    decide_max_tokens: int = 1500
    merge_max_tokens: int = 1500

    def _ask(self, step: str, temperature: float, max_tokens: int, **values: Any) -> str | None:
        prompt = self.prompts[step].safe_substitute({k: str(v) for k, v in values.items()})
        try:
            return self.evolver.chat([{"role": "user", "content": prompt}], temperature=temperature,
                                     max_tokens=max_tokens)
        except EvolverError as exc:
            log.warning("skillclaw: %s step skipped: %s", step, exc)
            return None

    # ------------------------------------------------------------------ steps 1 and 2

    def summarize(self, d: SessionDigest) -> None:
        text = self._ask("summarize", 0.2, self.summary_max_tokens, digest=d.render(self.digest_chars))
        d.summary = (text or "").strip() or "(no analysis: the evolver gave none)"

    def judge(self, d: SessionDigest) -> None:
        text = self._ask("judge", 0.1, self.judge_max_tokens, summary=d.summary, digest=d.render(self.digest_chars))
        parsed = parse_json(text or "")
        if parsed is None:
            return
        scores = {}
        for dim in DIMENSIONS:
            try:
                scores[dim] = min(max(float(parsed.get(dim)), 0.0), 1.0)
            except (TypeError, ValueError):
                return  # a judgement missing a dimension is no judgement
        total = sum(self.weights[k] for k in DIMENSIONS) or 1.0
        overall = sum(self.weights[k] * scores[k] for k in DIMENSIONS) / total
        d.judged = {**scores, "overall": round(overall, 4), "reason": str(parsed.get("reason") or "")[:500]}

    # ------------------------------------------------------------------ steps 4 and 5

    def _sessions_text(self, digests: list[SessionDigest]) -> str:
        shown = digests[-self.max_sessions:]
        blocks = []
        for d in shown:
            score = d.effective_score
            score_text = "unknown" if score is None else f"{score:.2f}" + ("" if d.reliable else " (judged)")
            blocks.append(f"### Session {d.task_id}: score {score_text}\n"
                          + (f"User feedback: {d.feedback}\n" if d.feedback else "") + f"Analysis: {d.summary}")
        return "\n\n".join(blocks)

    def decide(self, group: str, digests: list[SessionDigest], pool: SkillPool) -> Decision:
        shown = digests[-self.max_sessions:]
        ids = [d.task_id for d in shown]
        if group == NO_SKILL:
            catalogue = "\n".join(f"- {s.name}: {s.description}" for s in pool.skills.values()) or "(none)"
            text = self._ask("create", 0.4, self.decide_max_tokens, pool=catalogue, count=len(shown),
                             sessions=self._sessions_text(shown))
        else:
            skill = pool.get(group)
            text = self._ask("decide", 0.4, self.decide_max_tokens, name=group, count=len(shown),
                             description=skill.description if skill else "", body=skill.body if skill else "",
                             sessions=self._sessions_text(shown))
        return normalise(group, parse_json(text or "") if text is not None else None, pool, ids,
                         failed=text is None)

    def merge(self, old: Skill, new: Skill, rationale: str) -> Skill | None:
        text = self._ask("merge", 0.3, self.merge_max_tokens, name=old.name, old_description=old.description,
                         old_body=old.body, new_description=new.description, new_body=new.body,
                         rationale=rationale or "not given")
        parsed = parse_json(text or "")
        content = str((parsed or {}).get("content") or "").strip()
        if not content:
            return None
        return Skill(old.name, one_line(parsed.get("description") or old.description) or old.description, content)

    # ------------------------------------------------------------------ the night

    def run(self, digests: list[SessionDigest], base: SkillPool) -> NightResult:
        for d in digests:
            self.summarize(d)
        for d in digests:
            if not d.reliable:
                self.judge(d)
        groups = group_by_skill(digests)
        pool = base.copy()
        decisions, rationale = [], {}
        for group, members in groups.items():
            decision = self.decide(group, members, base)
            decisions.append(decision)
            applied = self.apply(decision, pool, base)
            if applied is not None:
                entry = {"action": applied, "group": group or "(no skill)", "fault": decision.fault or None,
                         "rationale": decision.rationale, "sessions": decision.sessions}
                rationale.setdefault(decision.name, {"steps": []})["steps"].append(entry)
        for info in rationale.values():
            info["action"] = info["steps"][-1]["action"]
        return NightResult(pool=pool, decisions=decisions, rationale=rationale,
                           judged={d.task_id: d.judged for d in digests if d.judged is not None},
                           summaries={d.task_id: d.summary for d in digests})

    def apply(self, decision: Decision, pool: SkillPool, base: SkillPool) -> str | None:
        """Apply one decision to ``pool``; the action applied (``merge`` for a colliding create),
        or None when nothing changed."""
        if decision.action == "skip":
            return None
        current = pool.get(decision.name)
        if decision.action == "optimize_description":
            pool.put(Skill(current.name, decision.description, current.body))
            return "optimize_description"
        proposed = Skill(decision.name, decision.description or (current.description if current else ""),
                         decision.content)
        if decision.action == "improve_skill":
            pool.put(proposed)
            return "improve_skill"
        if current is None:  # create_skill of a new name
            pool.put(proposed)
            return "create_skill"
        merged = self.merge(current, proposed, decision.rationale)
        if merged is None:
            decision.reason = (decision.reason + "; " if decision.reason else "") + \
                f"the merge with the existing skill {decision.name!r} gave no usable reply: skipped"
            return None
        pool.put(merged)
        return "merge"


def normalise(group: str, reply: dict[str, Any] | None, pool: SkillPool, sessions: list[str], *,
              failed: bool = False) -> Decision:
    """A decide reply as a ``Decision`` the pool can take; anything unusable becomes ``skip`` with a reason."""

    def skip(reason: str, **kw: Any) -> Decision:
        return Decision(group, "skip", reason=reason, sessions=sessions, **kw)

    if reply is None:
        return skip("the evolver failed" if failed else "the reply held no JSON object")
    action = str(reply.get("action") or "").strip()
    fault = str(reply.get("fault") or "").strip()
    rationale = str(reply.get("rationale") or "").strip()
    name = reply.get("name")
    name = name.strip() if isinstance(name, str) else ""
    description = one_line(reply.get("description"))
    content = str(reply.get("content") or "").strip()
    common = {"fault": fault, "rationale": rationale}
    if action not in ACTIONS:
        return skip(f"unknown action {action!r}", **common)
    if action == "skip":
        return skip("", **common)
    if group == NO_SKILL and action != "create_skill":
        return skip(f"{action} is not possible for sessions that used no skill", **common)
    if action == "create_skill":
        if not name:
            return skip("create_skill without a name", **common)
        if not valid_name(name):
            return skip(f"invalid skill name {name!r}", **common)
        if not content:
            return skip("create_skill without content", **common)
        if name == group:  # a "new" skill named like the group's own: an improvement of it
            return Decision(group, "improve_skill", name, description, content, reason="create_skill of the "
                            "group's own skill taken as improve_skill", sessions=sessions, **common)
        return Decision(group, "create_skill", name, description, content, sessions=sessions, **common)
    # improve_skill / optimize_description edit the group's own skill, whatever name the reply gives
    if pool.get(group) is None:
        return skip(f"{action} of {group!r}, which is not in the pool", **common)
    if action == "optimize_description":
        if not description:
            return skip("optimize_description without a description", **common)
        return Decision(group, action, group, description, sessions=sessions, **common)
    if not content:
        return skip("improve_skill without content", **common)
    return Decision(group, action, group, description, content, sessions=sessions, **common)
