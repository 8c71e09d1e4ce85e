"""PUCT scores, lineage blocking, back-propagation, duplicates, top-2 children and the cap, on hand-built trees."""

from __future__ import annotations

import math

import pytest

from reef_recipe_tttd.archive import Child, PUCTArchive, lineage_blocked


def tree():
    """seed s -> a (0.5) -> {a1 (0.9), a2 (0.6)}; seed s -> b (0.7)."""
    arch = PUCTArchive(c=1.0)
    s = arch.add_seed(None, 0.0)
    added = {n.solution: n for n in arch.expand(s.id, [Child("a", 0.5), Child("b", 0.7)])}
    arch.expand(added["a"].id, [Child("a1", 0.9), Child("a2", 0.6)])
    return arch, s, added["a"], added["b"]


def test_scores_follow_the_formula():
    arch, s, a, b = tree()
    for _ in range(3):
        arch.visit(a.id)  # a, s visited 3 times
    arch.visit(b.id)
    a1 = next(n for n in arch.nodes.values() if n.solution == "a1")
    a2 = next(n for n in arch.nodes.values() if n.solution == "a2")
    scores = arch.scores()
    n, t = 5, 4
    scale = 0.9 - 0.5  # non-seed values only
    denom = n * (n + 1) / 2
    # ranks by value: a1 0.9 (0), b 0.7 (1), a2 0.6 (2), a 0.5 (3), s 0.0 (4)
    expect = {
        a1.id: 0.9 + scale * (5 / denom) * math.sqrt(1 + t) / 1,
        b.id: 0.7 + scale * (4 / denom) * math.sqrt(1 + t) / 2,
        a2.id: 0.6 + scale * (3 / denom) * math.sqrt(1 + t) / 1,
        a.id: 0.9 + scale * (2 / denom) * math.sqrt(1 + t) / 4,   # Q = best below (a1)
        s.id: 0.9 + scale * (1 / denom) * math.sqrt(1 + t) / 5,
    }
    assert scores == pytest.approx(expect)
    assert arch.nodes[s.id].visits == 4 and arch.nodes[a.id].visits == 3 and arch.nodes[b.id].visits == 1


def test_visits_propagate_to_every_ancestor():
    arch, s, a, b = tree()
    a1 = next(n for n in arch.nodes.values() if n.solution == "a1")
    arch.visit(a1.id)
    assert (a1.visits, arch.nodes[a.id].visits, arch.nodes[s.id].visits, arch.nodes[b.id].visits) == (1, 1, 1, 0)
    assert arch.total == 1


def test_selection_blocks_lineages():
    arch, s, a, b = tree()
    for _ in range(4):
        arch.visit(next(n.id for n in arch.nodes.values() if n.solution == "a2"))
    chosen = arch.select(3)
    assert not lineage_blocked(arch, chosen)
    # a1 (best score) blocks its ancestors a and s; a2 (visited, so its bonus shrank) falls
    # behind b; siblings are not one another's lineage, so a2 is still free after b
    assert [n.solution for n in chosen] == ["a1", "b", "a2"]
    # picking a first would block a1 and a2 (its descendants) and s (its ancestor)
    assert set(arch.descendants(chosen[0].parent)) == {chosen[0].id, chosen[2].id}
    # more parents than free lineages: the blocking starts over, still `count` parents
    assert len(arch.select(4)) == 4


def test_expansion_keeps_top_two_and_skips_duplicates():
    arch = PUCTArchive()
    s = arch.add_seed()
    added = arch.expand(s.id, [Child("x", 0.1), Child("y", 0.3), Child("y", 0.3), Child("z", 0.2), Child("w", float("nan"))])
    assert [n.solution for n in added] == ["y", "z"]
    assert arch.expand(s.id, [Child("y", 0.9)]) == []  # already archived
    assert arch.nodes[s.id].best_below == pytest.approx(0.3)
    assert arch.best().solution == "y"


def test_cap_keeps_seeds_and_the_best():
    arch = PUCTArchive(max_size=3, children_per_expansion=2)
    s = arch.add_seed()
    arch.expand(s.id, [Child("a", 0.1), Child("b", 0.2)])
    arch.expand(s.id, [Child("c", 0.3), Child("d", 0.05)])
    assert len(arch.nodes) == 3
    assert {n.solution for n in arch.nodes.values()} == {None, "b", "c"}
    assert set(arch.nodes[s.id].children) <= set(arch.nodes)


def test_json_round_trip():
    arch, *_ = tree()
    arch.visit(next(iter(arch.nodes)))
    again = PUCTArchive.from_json(arch.to_json())
    assert again.scores() == pytest.approx(arch.scores())
    assert again.contains("a1") and not again.contains("zz")
