"""The PUCT archive that steers TTT-Discover's search (paper App. A.2).

Every node is a solution with its value (the raw metric that ranks the archive) and visits.
Choosing parents::

    rank the nodes by value (0 = best); N nodes
    P_i     = (N − rank_i) / (N(N+1)/2)                       the rank prior
    scale   = max − min of the non-seed values (≥ 1e-6)
    score_i = Q_i + c·scale·P_i·sqrt(1 + T)/(1 + n_i)

``Q_i`` is the best value found below the node (its own value while it has no children: "max
child"), ``T`` the number of expansions (rollouts) so far and ``n_i`` the node's visits. G parents
are chosen greedily by score, each winner blocking its whole lineage (ancestors and descendants)
so one step explores G different branches. Every rollout is a visit of its parent and of all its
ancestors, failed ones included. A parent keeps at most its best ``children_per_expansion``
children from one expansion; duplicates of an archived solution are skipped; past ``max_size``
the lowest non-seed nodes go, seeds always stay.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Node:
    """One archived solution (a seed has ``solution`` None: "no program yet")."""

    id: str
    solution: str | None
    #: the raw metric the archive ranks by (``scoreUnbounded`` in Guidance-TTT)
    value: float
    parent: str | None = None
    seed: bool = False
    #: the training reward it earned (may differ from ``value``)
    reward: float = 0.0
    #: the tail of the judge's output for this solution (what the next prompt quotes)
    output: str = ""
    #: Guidance-TTT's canonical summary of the solution
    summary: str = ""
    visits: int = 0
    #: best value in the subtree below the node (None: no children yet)
    best_below: float | None = None
    children: list[str] = field(default_factory=list)
    step: int = -1

    @property
    def q(self) -> float:
        return self.value if self.best_below is None else self.best_below


@dataclass
class Child:
    """A valid rollout offered to ``expand``."""

    solution: str
    value: float
    reward: float = 0.0
    output: str = ""
    summary: str = ""


def solution_key(solution: str | None) -> str:
    return hashlib.sha256((solution or "").strip().encode()).hexdigest()


class PUCTArchive:
    """Rank-prior PUCT over archived solutions, with lineage blocking and max-child Q."""

    def __init__(self, c: float = 1.0, max_size: int = 1000, children_per_expansion: int = 2):
        if c < 0 or max_size < 1 or children_per_expansion < 1:
            raise ValueError("c must be 0 or more, max_size and children_per_expansion 1 or more")
        self.c = float(c)
        self.max_size = int(max_size)
        self.children_per_expansion = int(children_per_expansion)
        self.nodes: dict[str, Node] = {}
        #: expansions (rollouts) so far
        self.total = 0
        self._next = 0
        self._keys: dict[str, str] = {}

    # ------------------------------------------------------------------ building

    def add_seed(self, solution: str | None = None, value: float = 0.0, *, output: str = "", summary: str = "") -> Node:
        return self._add(Node(id=self._new_id(), solution=solution, value=float(value), seed=True, output=output,
                              summary=summary))

    def _new_id(self) -> str:
        self._next += 1
        return f"n{self._next}"

    def _add(self, node: Node) -> Node:
        self.nodes[node.id] = node
        if node.solution is not None:
            self._keys.setdefault(solution_key(node.solution), node.id)
        return node

    # ------------------------------------------------------------------ scoring

    def scale(self) -> float:
        values = [n.value for n in self.nodes.values() if not n.seed]
        return max(max(values) - min(values), 1e-6) if values else 1e-6

    def scores(self) -> dict[str, float]:
        """``score_i`` of every node."""
        nodes = list(self.nodes.values())
        n = len(nodes)
        if n == 0:
            return {}
        ranked = sorted(nodes, key=lambda x: (-x.value, x.id))
        denom = n * (n + 1) / 2.0
        scale = self.scale()
        explore = self.c * scale * math.sqrt(1.0 + self.total)
        return {node.id: node.q + explore * ((n - rank) / denom) / (1.0 + node.visits)
                for rank, node in enumerate(ranked)}

    def ancestors(self, node_id: str) -> list[str]:
        out, seen = [], set()
        parent = self.nodes[node_id].parent if node_id in self.nodes else None
        while parent is not None and parent in self.nodes and parent not in seen:
            out.append(parent)
            seen.add(parent)
            parent = self.nodes[parent].parent
        return out

    def descendants(self, node_id: str) -> list[str]:
        out, stack = [], list(self.nodes[node_id].children) if node_id in self.nodes else []
        while stack:
            child = stack.pop()
            if child in self.nodes and child not in out:
                out.append(child)
                stack.extend(self.nodes[child].children)
        return out

    def select(self, count: int) -> list[Node]:
        """``count`` parents, greedily by score, each blocking its lineage; when every node is
        blocked the blocking starts over (a small archive still yields ``count`` parents)."""
        scores = self.scores()
        order = sorted(scores, key=lambda i: (-scores[i], i))
        chosen: list[Node] = []
        blocked: set[str] = set()
        while len(chosen) < count and order:
            free = [i for i in order if i not in blocked]
            if not free:
                blocked = set()
                continue
            winner = free[0]
            chosen.append(self.nodes[winner])
            blocked |= {winner, *self.ancestors(winner), *self.descendants(winner)}
        return chosen

    # ------------------------------------------------------------------ updating

    def visit(self, node_id: str) -> None:
        """One rollout from ``node_id``: a visit of it and of every ancestor, and one expansion."""
        self.total += 1
        for i in [node_id, *self.ancestors(node_id)]:
            self.nodes[i].visits += 1

    def contains(self, solution: str) -> bool:
        return solution_key(solution) in self._keys

    def expand(self, parent_id: str, children: Iterable[Child], *, step: int = -1) -> list[Node]:
        """Archive the best ``children_per_expansion`` new, distinct children of ``parent_id``
        and raise the Q of its lineage; returns the nodes added."""
        fresh: dict[str, Child] = {}
        for ch in children:
            if not math.isfinite(ch.value):
                continue
            key = solution_key(ch.solution)
            if key in self._keys:
                continue
            if key not in fresh or ch.value > fresh[key].value:
                fresh[key] = ch
        best = sorted(fresh.values(), key=lambda ch: -ch.value)[: self.children_per_expansion]
        added = []
        for ch in best:
            node = self._add(Node(id=self._new_id(), solution=ch.solution, value=float(ch.value), parent=parent_id,
                                  reward=float(ch.reward), output=ch.output, summary=ch.summary, step=step))
            self.nodes[parent_id].children.append(node.id)
            for i in [parent_id, *self.ancestors(parent_id)]:
                anc = self.nodes[i]
                anc.best_below = node.value if anc.best_below is None else max(anc.best_below, node.value)
            added.append(node)
        self._cap()
        return added

    def _cap(self) -> None:
        extra = len(self.nodes) - self.max_size
        if extra <= 0:
            return
        removable = sorted((n for n in self.nodes.values() if not n.seed), key=lambda n: (n.value, n.id))
        for node in removable[:extra]:
            del self.nodes[node.id]
            if self._keys.get(solution_key(node.solution)) == node.id:
                del self._keys[solution_key(node.solution)]
        for node in self.nodes.values():
            node.children = [c for c in node.children if c in self.nodes]

    # ------------------------------------------------------------------ reading

    def best(self) -> Node | None:
        real = [n for n in self.nodes.values() if not n.seed and n.solution is not None]
        return max(real, key=lambda n: (n.value, -int(n.id[1:]))) if real else None

    def best_value(self, default: float = 0.0) -> float:
        node = self.best()
        return node.value if node is not None else default

    def to_json(self) -> dict[str, Any]:
        return {"c": self.c, "max_size": self.max_size, "children_per_expansion": self.children_per_expansion,
                "total": self.total, "next": self._next, "nodes": [asdict(n) for n in self.nodes.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PUCTArchive:
        archive = cls(c=data["c"], max_size=data["max_size"], children_per_expansion=data["children_per_expansion"])
        archive.total = int(data["total"])
        archive._next = int(data["next"])
        for raw in data["nodes"]:
            archive._add(Node(**raw))
        return archive


def lineage_blocked(archive: PUCTArchive, chosen: Sequence[Node]) -> bool:
    """Whether two of ``chosen`` share a lineage (a test and debugging aid)."""
    ids = [n.id for n in chosen]
    for i, a in enumerate(ids):
        related = {*archive.ancestors(a), *archive.descendants(a)}
        if any(b in related for b in ids[i + 1:]):
            return True
    return False
