"""The ``feedback_rules`` recipe: textual feedback on low-scored answers becomes harness rules.

The simplest real harness learner, needing no GPU and no model of its own: each batch of
low-scored reports with feedback adds general rules to ``harness/rules.md`` (normalised,
deduplicated, capped; existing rules are kept, and so is any text of the file that is not a
rule bullet). With a ``proposer`` configured, a model first rewrites each raw feedback into a
concise rule; on any error the raw feedback is used instead, so learning never stalls on it.

Options (``conf/recipe/feedback_rules.yaml``, ``scenarios.<s>.recipe_options``):
``batch_size``, ``max_score`` (reports scored above it are not learned from), ``max_rules``,
``max_rule_chars``, ``proposer`` (None; ``runtime`` for the scenario's own runtime; or
``{url, model, api_key, timeout_s}`` of an OpenAI-compatible endpoint).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from ..contracts import Recipe, refuse_bad_options
from ..hookspecs import hookimpl
from ..kit.records import chat_request
from ..kit.urls import basic_auth, split_url_credentials
from ..observe import Batch, Experience, response_text
from ..types import ActiveRelease, Candidate

log = logging.getLogger("reef.recipe.feedback_rules")

REWRITE_PROMPT = (
    "You maintain the rules an AI assistant follows. A user gave the feedback below on one of its "
    "answers. Rewrite it as ONE short, general rule in the imperative that would have avoided the "
    "problem in future answers. Reply with the rule only, no preamble, no quotes."
)
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


#: control characters (C0, DEL, C1): no place in a one-line rule
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def normalize_rule(text: str, max_chars: int) -> str:
    """One line, no bullet, quotes or control characters (a NUL reached the served system prompt),
    first letter capitalised, ends with a full stop, at most ``max_chars`` characters."""
    text = _CONTROL.sub(" ", text)
    text = _BULLET.sub("", " ".join(text.split())).strip().strip("\"'`").strip()
    if not text:
        return ""
    first = text[0].upper()
    text = (first if len(first) == 1 else text[0]) + text[1:]  # "ß".upper() is "SS": kept as it is
    if text[-1] not in ".!?…":
        text += "."
    if len(text) > max_chars:  # after the full stop: a rule of max_chars was one character over
        text = text[: max_chars - 1].rstrip() + "…"
    return text


def rule_key(rule: str) -> str:
    """What makes two rules the same: their words, case and punctuation ignored."""
    return " ".join(re.findall(r"\w+", rule.casefold()))


def parse_rules(text: str) -> tuple[str, list[str]]:
    """(text that is not a rule bullet, the rules) of a ``rules.md``."""
    preamble, rules = [], []
    for line in text.splitlines():
        if _BULLET.match(line):
            rules.append(_BULLET.sub("", line).strip())
        elif line.strip() and not (line.startswith("#") and line.strip("# ").casefold() == "rules"):
            preamble.append(line.rstrip())
    return "\n".join(preamble).strip(), rules


def render_rules(preamble: str, rules: list[str]) -> str:
    head = (preamble + "\n\n") if preamble else ""
    return head + "".join(f"- {r}\n" for r in rules)


class FeedbackRulesRecipe(Recipe):
    """Turns the textual feedback of low-scored reports into rules in ``harness/rules.md``."""

    update_target = "harness"
    default_evaluator = "task_suite"

    def __init__(self, batch_size: int = 3, max_score: float | None = 0.5, max_rules: int = 50,
                 max_rule_chars: int = 240, proposer: str | dict[str, Any] | None = None):
        refuse_bad_options(type(self), locals())
        self.batch_size = batch_size
        self.max_score = max_score
        self.max_rules = max_rules
        self.max_rule_chars = max_rule_chars
        self.proposer = proposer

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values (``reef config`` asks before anything is built)."""
        problems = []
        if o["batch_size"] < 1:
            problems.append("batch_size must be 1 or more")
        if o["max_rules"] < 1 or o["max_rule_chars"] < 20:
            problems.append("max_rules must be 1 or more and max_rule_chars 20 or more")
        max_score = o["max_score"]
        if isinstance(max_score, float) and not math.isfinite(max_score):
            problems.append("max_score must be a finite number (or null: every scored report), not "
                            f"{max_score!r}: no score is ever at or below NaN, so nothing would be learnt")
        proposer = o["proposer"]
        if isinstance(proposer, dict):
            if not proposer.get("url"):
                problems.append("proposer needs a 'url' (an OpenAI-compatible endpoint) or the string 'runtime'")
            elif not str(proposer["url"]).startswith(("http://", "https://")):
                problems.append("proposer.url must start with http:// or https://")
            unknown = set(proposer) - {"url", "model", "api_key", "timeout_s"}
            if unknown:  # a typo (`modle`, `apikey`) would send model "default" without auth
                problems.append(f"proposer takes url, model, api_key and timeout_s, not {', '.join(sorted(map(str, unknown)))}")
            timeout = proposer.get("timeout_s", 60)
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
                problems.append(f"proposer.timeout_s must be a number of seconds above 0, not {timeout!r}")
        if isinstance(proposer, str) and proposer != "runtime":
            problems.append("proposer must be 'runtime' or {url, model, api_key, timeout_s}")
        return problems

    @property
    def filters(self) -> list[Any]:
        if self.max_score is None:
            return ["scored"]
        return ["scored", ("score_window", {"max": self.max_score})]

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: Any) -> Candidate | None:
        feedback = [(e, e.feedback_text()) for e in batch if e.feedback_text()]
        if not feedback:
            return None
        rules_md = current.harness_dir / "rules.md" if current is not None and current.harness_dir else None
        text = rules_md.read_text(encoding="utf-8") if rules_md is not None and rules_md.is_file() else ""
        preamble, rules = parse_rules(text)
        keys = {rule_key(r) for r in rules}
        added: list[str] = []
        with ctx.progress.task("writing rules from feedback", total=len(feedback)) as bar:
            for exp, text in feedback:
                rule = normalize_rule(self._rewrite(exp, text, ctx), self.max_rule_chars)
                bar.advance()
                key = rule_key(rule)
                if not key or key in keys:
                    continue
                if len(rules) >= self.max_rules:
                    ctx.log.info("rules cap (%d) reached; further feedback in this batch is not turned into rules",
                                 self.max_rules)
                    break
                keys.add(key)
                rules.append(rule)
                added.append(rule)
        if not added:
            return None
        artifact = ctx.new_artifact()
        (artifact / "harness").mkdir(parents=True, exist_ok=True)
        (artifact / "harness" / "rules.md").write_text(render_rules(preamble, rules), encoding="utf-8")
        return Candidate(scenario=batch.scenario, recipe="feedback_rules", artifact_dir=artifact,
                         summary=f"add {len(added)} rule(s): " + " | ".join(added),
                         metadata={"added_rules": added, "rules": len(rules)})

    # ------------------------------------------------------------------ proposer

    def _rewrite(self, exp: Experience, feedback: str, ctx: Any) -> str:
        if self.proposer is None:
            return feedback
        question = ""
        if exp.records:
            req = chat_request(exp.records[-1].request)  # any route's record, as Chat Completions
            users = [m for m in req["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            if users:
                content = users[-1].get("content")
                question = content if isinstance(content, str) else response_text({"content": content})
        user = f"Request: {question[:2000]}\n\nFeedback: {feedback}" if question else f"Feedback: {feedback}"
        messages = [{"role": "system", "content": REWRITE_PROMPT}, {"role": "user", "content": user}]
        try:
            rule = self._ask(messages, ctx).strip()
            if not rule:
                raise ValueError("the proposer answered with an empty rule")
            return rule.splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - documented fallback: the raw feedback
            ctx.log.warning("proposer failed (%s: %s); using the raw feedback as the rule", type(exc).__name__, exc)
            return feedback

    def _ask(self, messages: list[dict[str, Any]], ctx: Any) -> str:
        if self.proposer == "runtime":
            if ctx.runtime.dialect == "anthropic":
                body = {"model": ctx.settings.runtime.get("model") or "default", "max_tokens": 200,
                        "system": messages[0]["content"], "messages": messages[1:]}
            else:
                body = {"model": ctx.settings.runtime.get("model") or "default", "messages": messages,
                        "max_tokens": 200}
            return response_text(ctx.complete(body, None, timeout_s=60))
        cfg = dict(self.proposer)
        # Credentials in the URL travel as Basic auth and never reach a message or log line.
        url, credentials = split_url_credentials(str(cfg["url"]), key="recipe.proposer.url")
        url = url.rstrip("/")
        if not url.endswith("/chat/completions"):
            url += "/chat/completions" if url.endswith("/v1") else "/v1/chat/completions"
        headers = {"authorization": f"Bearer {cfg['api_key']}"} if cfg.get("api_key") else {}
        if credentials is not None and not headers:
            headers["authorization"] = basic_auth(credentials)
        body = {"model": cfg.get("model") or "default", "messages": messages, "max_tokens": 200, "temperature": 0}
        import httpx  # here: every command loads the built-in plugins, few of them call a proposer

        r = httpx.post(url, json=body, headers=headers, timeout=float(cfg.get("timeout_s", 60)))
        if r.status_code >= 400:  # raise_for_status() would quote the URL
            raise RuntimeError(f"the proposer answered HTTP {r.status_code}")
        return response_text(r.json())


@hookimpl
def register_recipes(register: Any) -> None:
    register("feedback_rules", FeedbackRulesRecipe)
