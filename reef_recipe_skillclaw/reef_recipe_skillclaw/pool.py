"""The skill pool: ``harness/skills/<name>/SKILL.md`` as named skills, their diff, and writing them back.

A ``SKILL.md`` starts with front matter holding ``name:`` and ``description:`` (one line each,
read line by line as the server reads them when it announces the catalogue), then the skill's
text. The pool of the serving release is where a night starts; a harness without skills starts
empty. Skills are never removed: a diff holds creates and updates only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

#: a skill name: letters, digits, ``-`` and ``_`` (it is also the skill's directory name)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: the server announces at most this much of a description in its catalogue
MAX_DESCRIPTION = 300
_FRONT = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*(?:\n|\Z)", re.DOTALL)


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(NAME.match(name))


def one_line(text: object, limit: int = MAX_DESCRIPTION) -> str:
    """``text`` as one line of front matter: whitespace collapsed, cut at ``limit`` characters."""
    return " ".join(str(text or "").split())[:limit].strip()


@dataclass(frozen=True)
class Skill:
    """One skill: its name, the trigger description the catalogue announces, and its text."""

    name: str
    description: str
    body: str

    def render(self) -> str:
        """The ``SKILL.md`` text: front matter with ``name:``/``description:``, then the body."""
        return f"---\nname: {self.name}\ndescription: {one_line(self.description)}\n---\n\n{self.body.strip()}\n"

    @classmethod
    def parse(cls, dirname: str, text: str) -> Skill:
        """A ``SKILL.md``; the directory name and the body's first line stand in for missing front matter."""
        name, description, body = dirname, "", text
        m = _FRONT.match(text)
        if m:
            body = text[m.end():]
            for line in m.group(1).splitlines():
                key, _, value = line.partition(":")
                value = value.strip().strip("'\"")
                if key.strip() == "name" and value:
                    name = value
                elif key.strip() == "description" and value:
                    description = value
        if not description:
            description = next((ln.strip() for ln in body.splitlines()
                                if ln.strip() and not ln.lstrip().startswith("#")), "")
        return cls(name=name if valid_name(name) else dirname, description=one_line(description), body=body.strip())


@dataclass(frozen=True)
class Change:
    """One skill a night created or updated (``fields``: what of it changed)."""

    op: str  # create | update
    name: str
    fields: tuple[str, ...] = ()


@dataclass
class SkillPool:
    """Skills by name, in name order when listed."""

    skills: dict[str, Skill] = field(default_factory=dict)

    @classmethod
    def load(cls, harness_dir: Path | None) -> SkillPool:
        """The skills of a ``harness/`` directory (empty without one); directories with an
        invalid name or without a ``SKILL.md`` are left out."""
        pool = cls()
        skills_dir = harness_dir / "skills" if harness_dir is not None else None
        if skills_dir is None or not skills_dir.is_dir():
            return pool
        for d in sorted(p for p in skills_dir.iterdir() if p.is_dir() and valid_name(p.name)):
            f = d / "SKILL.md"
            if f.is_file():
                skill = Skill.parse(d.name, f.read_text(encoding="utf-8"))
                pool.skills[d.name] = replace(skill, name=d.name)
        return pool

    def copy(self) -> SkillPool:
        return SkillPool(dict(self.skills))

    @property
    def names(self) -> list[str]:
        return sorted(self.skills)

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def put(self, skill: Skill) -> None:
        if not valid_name(skill.name):
            raise ValueError(f"invalid skill name {skill.name!r}: use letters, digits, '-' and '_'")
        self.skills[skill.name] = replace(skill, description=one_line(skill.description), body=skill.body.strip())

    def diff(self, base: SkillPool) -> list[Change]:
        """What this pool creates or updates relative to ``base``; a skill missing here is not a removal."""
        changes = []
        for name in self.names:
            new, old = self.skills[name], base.get(name)
            if old is None:
                changes.append(Change("create", name, ("description", "body")))
                continue
            fields = tuple(f for f in ("description", "body") if getattr(new, f).strip() != getattr(old, f).strip())
            if fields:
                changes.append(Change("update", name, fields))
        return changes

    def write(self, harness_dir: Path, names: list[str]) -> None:
        """Write the named skills' ``SKILL.md`` under ``harness_dir/skills/``."""
        for name in names:
            path = harness_dir / "skills" / name / "SKILL.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.skills[name].render(), encoding="utf-8")
