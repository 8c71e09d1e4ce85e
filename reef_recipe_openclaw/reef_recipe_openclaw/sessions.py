"""Sessions from recorded traffic: which request is the next turn of which conversation.

An agent sends its whole conversation with every request. OpenClaw learns from what follows a
reply (the user's next message, or a tool's result), so each served turn has to be paired
with the request that came after it. ``SessionIndex`` does that from records alone:

1. **Filter.** Side calls (requests that are not main turns: a title or a compaction call, said
   with ``x-reef-tag-turn: side``, or any request without ``tools`` when
   ``main_turn_requires_tools``) and records that are not a served answer (an error, an
   incomplete stream, no messages) are dropped.
2. **Which session.** ``x-reef-session`` (or ``x-reef-tag-session``) names it when present:
   turns of a named session bind in arrival order. Otherwise trace matching: a request whose
   canonical message list (role, text, tool-call names and arguments; system messages left out)
   strictly extends an open session's last request, with that request's served reply in the
   slot right after it and at least one more message, is that session's next turn. Ties go to
   the most recently active session; a request that matches nothing opens a new session.
3. **Retries.** A request identical to its session's last one is a retry and is dropped.
4. **Binding.** When a session's next turn arrives, the session's pending turn is bound to the
   new request's trailing message (its text and role: ``user`` or ``tool``) as its next state.
   Each session holds one unbound turn; a session's last turn never trains and expires after
   ``ttl_s`` without activity (the least recently active session also goes when more than
   ``max_open`` are open).

Everything here is pure bookkeeping (no I/O, no clock: times come with the records), so it is
tested with scripted traffic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reef_core.kit import chat_reply, chat_request

#: the route of ``POST /v1/responses`` records (their bodies are Responses items, not messages)
RESPONSES_ROUTE = "openai.responses"

Canonical = tuple[str, str, tuple[tuple[str, str], ...]]  # role, text, ((tool name, arguments), ...)


@dataclass(frozen=True)
class NextState:
    """What followed a reply: the next request's trailing message."""

    role: str  # user | tool | assistant | ...
    text: str
    record_id: str


@dataclass(frozen=True)
class Turn:
    """One main turn: a served request and its reply, as the index keeps it."""

    record_id: str
    session: str
    at: float
    messages: tuple[Canonical, ...]
    reply: Canonical
    #: the record, for whoever judges or trains on the turn
    record: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class BoundTurn:
    """A turn and what happened next: ready to be judged."""

    turn: Turn
    next_state: NextState


@dataclass
class Observation:
    """What one record did to the index."""

    bound: list[BoundTurn] = field(default_factory=list)
    expired: list[Turn] = field(default_factory=list)
    #: why the record was not taken as a turn: side_call | not_served | retry (None: it was)
    dropped: str | None = None
    session: str | None = None


@dataclass
class _Session:
    key: str
    tagged: bool
    pending: Turn
    last_active: float


class SessionIndex:
    """Open sessions and their one pending turn each; feed it records in arrival order."""

    def __init__(self, ttl_s: float = 900.0, max_open: int = 1000, main_turn_requires_tools: bool = False):
        if ttl_s <= 0 or max_open < 1:
            raise ValueError("session_ttl_s must be above 0 and max_open_sessions at least 1")
        self.ttl_s = float(ttl_s)
        self.max_open = int(max_open)
        self.main_turn_requires_tools = bool(main_turn_requires_tools)
        self._sessions: dict[str, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def pending(self, key: str) -> Turn | None:
        """The unbound turn of session ``key`` (None when it is not open)."""
        s = self._sessions.get(key)
        return s.pending if s is not None else None

    def expire(self, now: float) -> list[Turn]:
        """Close the sessions idle for longer than the TTL; their pending turns never train."""
        gone = [k for k, s in self._sessions.items() if now - s.last_active > self.ttl_s]
        return [self._sessions.pop(k).pending for k in gone]

    def observe(self, record: Any, now: float | None = None) -> Observation:
        """Take one stored record (an ``ExperienceRecord``) into the index."""
        at = record_time(record, now)
        obs = Observation(expired=self.expire(at))
        reason = drop_reason(record, self.main_turn_requires_tools)
        if reason is not None:
            obs.dropped = reason
            return obs
        request = request_of(record)
        messages = canonical_messages(request, record.route)
        reply = canonical_reply(record.response, record.route)
        tag = session_tag(record)
        if tag is not None:
            key = f"tag:{tag}"
            session = self._sessions.get(key)
        else:
            key, session = self._match(messages)
            if session is None and key is not None:  # identical to a session's last request
                obs.dropped, obs.session = "retry", key
                self._sessions[key].last_active = at
                return obs
        if session is not None and session.pending.messages == messages:
            obs.dropped, obs.session = "retry", session.key
            session.last_active = at
            return obs
        turn = Turn(record_id=record.id, session="", at=at, messages=messages, reply=reply, record=record)
        if session is not None:
            nxt = trailing_message(request, record.route)
            obs.bound.append(BoundTurn(session.pending, NextState(nxt[0], nxt[1], record.id)))
            session.pending = _with_session(turn, session.key)
            session.last_active = at
        else:
            key = key or f"trace:{record.id}"
            self._sessions[key] = _Session(key=key, tagged=tag is not None, pending=_with_session(turn, key),
                                           last_active=at)
            obs.expired += self._evict()
        obs.session = key
        return obs

    def _match(self, messages: tuple[Canonical, ...]) -> tuple[str | None, _Session | None]:
        """(key, session) this untagged request continues; (key, None) when it repeats a
        session's last request (a retry); (None, None) when it starts a new session."""
        best: _Session | None = None
        retry: _Session | None = None
        for s in self._sessions.values():
            if s.tagged:
                continue
            last = s.pending.messages
            if messages == last:
                if retry is None or s.last_active > retry.last_active:
                    retry = s
                continue
            n = len(last)
            if len(messages) >= n + 2 and messages[:n] == last and messages[n] == s.pending.reply:
                if best is None or s.last_active > best.last_active:
                    best = s
        if best is not None:
            return best.key, best
        if retry is not None:
            return retry.key, None
        return None, None

    def _evict(self) -> list[Turn]:
        out = []
        while len(self._sessions) > self.max_open:
            oldest = min(self._sessions.values(), key=lambda s: s.last_active)
            out.append(self._sessions.pop(oldest.key).pending)
        return out


def _with_session(turn: Turn, key: str) -> Turn:
    return Turn(record_id=turn.record_id, session=key, at=turn.at, messages=turn.messages, reply=turn.reply,
                record=turn.record)


# ---------------------------------------------------------------------- record helpers


def record_time(record: Any, now: float | None = None) -> float:
    """Seconds since the epoch the record was created (``now`` when it carries no time)."""
    created = getattr(record, "created_at", None)
    if isinstance(created, datetime):
        return created.timestamp()
    return float(now) if now is not None else 0.0


def session_tag(record: Any) -> str | None:
    """The session a harness named: ``x-reef-session``, else ``x-reef-tag-session``."""
    if getattr(record, "session", None):
        return str(record.session)
    tags = getattr(record, "tags", None) or {}
    value = tags.get("session")
    return str(value) if value else None


def drop_reason(record: Any, main_turn_requires_tools: bool = False) -> str | None:
    """Why ``record`` is not a main turn (``not_served``, ``side_call``), or None."""
    request = request_of(record)
    if getattr(record, "status", "ok") != "ok" or not isinstance(request, dict) or not request.get("messages") \
            or getattr(record, "response", None) is None:
        return "not_served"
    turn_tag = str((getattr(record, "tags", None) or {}).get("turn", "")).lower()
    if turn_tag == "side":
        return "side_call"
    if turn_tag != "main" and main_turn_requires_tools and not request.get("tools"):
        return "side_call"
    return None


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") in ("text", None) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") == "tool_result":
                    parts.append(_text(part.get("content")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return "" if content is None else str(content)


def _canonical_openai(message: dict[str, Any]) -> Canonical:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append((str(fn.get("name", "")), _arguments(fn.get("arguments", ""))))
    return (str(message.get("role", "")), _text(message.get("content")), tuple(calls))


def _canonical_anthropic(role: str, content: Any) -> Canonical:
    if isinstance(content, list):
        calls = tuple((str(b.get("name", "")), _arguments(b.get("input", {})))
                      for b in content if isinstance(b, dict) and b.get("type") == "tool_use")
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            role = "tool"
        return (role, _text(content), calls)
    return (role, _text(content), ())


def request_of(record: Any) -> dict[str, Any]:
    """The record's request with ``messages``: a ``/v1/responses`` body (instructions and input
    items) as the Chat Completions conversation it stands for; other routes as recorded."""
    request = getattr(record, "request", None)
    if getattr(record, "route", None) == RESPONSES_ROUTE:
        return chat_request(request)
    return request if isinstance(request, dict) else {}


def canonical_messages(request: dict[str, Any], route: str | None = None) -> tuple[Canonical, ...]:
    """The conversation of a request as comparable tuples, system messages left out."""
    out = []
    for m in request.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") in ("system", "developer"):
            continue
        if _anthropic(route):
            out.append(_canonical_anthropic(str(m.get("role", "")), m.get("content")))
        else:
            out.append(_canonical_openai(m))
    return tuple(out)


def canonical_reply(response: Any, route: str | None = None) -> Canonical:
    """The served reply as the next request would quote it."""
    if not isinstance(response, dict):
        return ("assistant", "", ())
    if route == RESPONSES_ROUTE or response.get("object") == "response":
        return _canonical_openai(chat_reply(response) or {"role": "assistant"})
    if _anthropic(route) or response.get("type") == "message":
        return _canonical_anthropic("assistant", response.get("content"))
    choices = response.get("choices") or [{}]
    message = choices[0].get("message") or {} if isinstance(choices[0], dict) else {}
    return _canonical_openai({**message, "role": "assistant"})


def trailing_message(request: dict[str, Any], route: str | None = None) -> tuple[str, str]:
    """(role, text) of a request's last message: the next state of the turn before it.

    A tool result is role ``tool`` in both dialects (Anthropic sends it as a user message)."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    if not messages:
        return ("user", "")
    role, text, calls = (_canonical_anthropic(str(messages[-1].get("role", "")), messages[-1].get("content"))
                         if _anthropic(route) else _canonical_openai(messages[-1]))
    if role == "function":
        role = "tool"
    if not text and calls:
        text = "; ".join(f"{name}({args})" for name, args in calls)
    return (role, text)


def _anthropic(route: str | None) -> bool:
    return bool(route) and str(route).startswith("anthropic")
