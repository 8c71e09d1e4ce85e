"""docs/plugins.md and docs/learning.md agree with the code: hook signatures, the contracts
table, propose's argument, and the complete recipe example runs."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from reef_core import hookspecs
from reef_core.protocols import contracts_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
PLUGINS_MD = (DOCS / "plugins.md").read_text()
LEARNING_MD = (DOCS / "learning.md").read_text()


def _hookspecs() -> dict[str, str]:
    return {name: f"{name}({', '.join(inspect.signature(fn).parameters)})"
            for name, fn in vars(hookspecs).items()
            if inspect.isfunction(fn) and hasattr(fn, "reef_spec")}


def _table(header: str) -> str:
    """The Markdown table of docs/plugins.md that starts with ``header``."""
    start = PLUGINS_MD.index(header)
    end = PLUGINS_MD.find("\n\n", start)
    return PLUGINS_MD[start:end if end >= 0 else None]


def _documented_hooks() -> dict[str, str]:
    """``name(args)`` of each row of the hook table in docs/plugins.md."""
    rows = re.finditer(r"^\| `(\w+)\(([^`]*)\)` \|", _table("| hook | contributes |"), re.M)
    return {m.group(1): f"{m.group(1)}({m.group(2)})" for m in rows}


def test_every_documented_kit_exists_with_those_parameters():
    import reef_core.testing as testing

    rows = list(re.finditer(r"^\| `(check_\w+)\(([^`]*)\)` \|", _table("| kit | checks |"), re.M))
    assert {m.group(1) for m in rows} == {n for n in testing.__all__ if n.startswith("check_")}
    for m in rows:
        documented = [p.split("=")[0].strip() for p in m.group(2).split(",")]
        actual = list(inspect.signature(getattr(testing, m.group(1))).parameters)
        assert documented == actual[: len(documented)], m.group(0)


def test_hookspecs_are_found():
    assert len(_hookspecs()) >= 12 and "register_recipes" in _hookspecs()


@pytest.mark.parametrize("hook", sorted(_hookspecs()))
def test_every_hook_is_documented_with_its_signature(hook):
    assert _documented_hooks().get(hook) == _hookspecs()[hook]


def test_the_docs_name_no_hook_that_does_not_exist():
    assert set(_documented_hooks()) <= set(_hookspecs())


def test_contracts_table_is_the_generated_one():
    m = re.search(r"<!-- contracts table: .*? -->\n(.*?)\n<!-- end contracts table -->", PLUGINS_MD, re.S)
    assert m, "docs/plugins.md lost its contracts table markers"
    assert m.group(1) == contracts_table(), "regenerate the table with reef_core.protocols.contracts_table()"


@pytest.mark.parametrize("doc", [PLUGINS_MD, LEARNING_MD], ids=["plugins.md", "learning.md"])
def test_propose_takes_the_serving_release(doc):
    signatures = re.findall(r"def propose\(self, batch[^,]*, (\w+)(: [^,]+)?, ctx", doc)
    assert signatures and all(sig == ("current", ": ActiveRelease | None") for sig in signatures), signatures
    assert "current_artifact" not in doc


def _complete_python_blocks(text: str) -> list[str]:
    """Python code blocks that are whole modules (no ``...`` placeholders) with a test in them."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return [b for b in blocks if "..." not in b and "def test_" in b]


def test_the_complete_recipe_example_runs(tmp_path):
    blocks = _complete_python_blocks(PLUGINS_MD)
    assert len(blocks) == 1
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(blocks[0], "docs/plugins.md", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test(tmp_path / test.__name__)
