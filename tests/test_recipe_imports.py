"""Weight recipes reach the served model through ``reef_core.TrainableBase`` and train with
``reef-train``: no recipe package (``reef_recipe_*`` at the top level or under ``examples/``)
imports a runtime's package, and none computes its own token logprobs (``reef_train.logprobs``
is the one place they come from, in the convention the runtime records)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGES = ("reef_torch", "reef_sglang")
#: what computing logprobs from logits takes (a reference, called or passed on, counts)
LOGPROB_OPS = {"log_softmax", "cross_entropy", "nll_loss"}
#: a function named like one that computes logprobs: token_logprobs, response_logp, logprob_of ...
LOGPROB_NAME = re.compile(r"(^|_)log_?p(robs?|s)?($|_)", re.IGNORECASE)
SKIP_PARTS = {"build", ".venv", "__pycache__", ".hypothesis"}


def recipe_packages(root: Path = ROOT) -> list[Path]:
    """Every recipe package directory: ``reef_recipe_*/`` at ``root`` and under ``examples/``."""
    return sorted(p for p in [*root.glob("reef_recipe_*/"), *root.glob("examples/reef_recipe_*/")] if p.is_dir())


def sources(package: Path) -> list[Path]:
    return sorted(f for f in package.rglob("*.py")
                  if not SKIP_PARTS.intersection(f.relative_to(package).parts)
                  and not any(part.endswith(".egg-info") for part in f.parts))


def _runtime_module(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in RUNTIME_PACKAGES


def runtime_imports(path: Path) -> list[str]:
    """``file:line: module`` for each import of a runtime package in ``path``: ``import``,
    ``from ... import`` and ``importlib.import_module`` / ``__import__`` with a literal name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and (
                    (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")) or
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{path}:{node.lineno}: {name}" for name in names if _runtime_module(name)]
    return found


def test_the_scan_finds_the_recipe_packages():
    assert ROOT / "examples" / "reef_recipe_few_shot" in recipe_packages()
    assert all(sources(p) for p in recipe_packages())


def test_no_recipe_imports_a_runtime_package():
    offences = [line for package in recipe_packages() for f in sources(package) for line in runtime_imports(f)]
    assert offences == [], ("recipes reach the base model through reef_core.TrainableBase "
                            "(require_trainable) and train with reef_train, never a runtime's package:\n"
                            + "\n".join(offences))


def test_the_scanner_flags_every_way_of_importing_a_runtime(tmp_path):
    package = tmp_path / "reef_recipe_sao"
    (package / "reef_recipe_sao").mkdir(parents=True)
    (tmp_path / "examples" / "reef_recipe_demo").mkdir(parents=True)
    (tmp_path / "reef_recipe_sao" / "build").mkdir()
    (tmp_path / "reef_recipe_sao" / "build" / "old.py").write_text("import reef_torch\n")  # build output: skipped
    source = package / "reef_recipe_sao" / "__init__.py"
    source.write_text(
        "import reef_torch\n"
        "from reef_sglang.runtime import SGLangRuntime\n"
        "import reef_train, reef_core\n"
        "from reef_core import require_trainable\n"
        "import reef_torchvision\n"
        "def propose():\n"
        "    import importlib\n"
        "    importlib.import_module('reef_torch.runtime')\n"
        "    return __import__('reef_sglang')\n"
    )
    assert recipe_packages(tmp_path) == [tmp_path / "examples" / "reef_recipe_demo", package]
    assert [f for p in recipe_packages(tmp_path) for f in sources(p)] == [source]
    assert runtime_imports(source) == [
        f"{source}:1: reef_torch",
        f"{source}:2: reef_sglang.runtime",
        f"{source}:8: reef_torch.runtime",
        f"{source}:9: reef_sglang",
    ]


def own_logprob_code(path: Path) -> list[str]:
    """``file:line: what`` for each function named like a logprob function and each use of an
    operation that turns logits into logprobs, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and LOGPROB_NAME.search(node.name):
            found.append(f"{path}:{node.lineno}: def {node.name}")
        elif isinstance(node, ast.Attribute) and node.attr in LOGPROB_OPS:
            found.append(f"{path}:{node.lineno}: {node.attr}")
        elif isinstance(node, ast.Name) and node.id in LOGPROB_OPS:
            found.append(f"{path}:{node.lineno}: {node.id}")
    return found


def package_sources(package: Path) -> list[Path]:
    """A recipe package's own code: ``sources`` without its tests (which may build oracles)."""
    return [f for f in sources(package) if "tests" not in f.relative_to(package).parts
            and not f.name.startswith("test_") and f.name != "conftest.py"]


def test_no_recipe_computes_its_own_logprobs():
    offences = [line for package in recipe_packages() for f in package_sources(package) for line in own_logprob_code(f)]
    assert offences == [], ("a recipe takes token logprobs from reef_train (token_logprobs, vocab_logprobs, "
                            "reference_logprobs; scaled_log_softmax is the convention), never its own:\n"
                            + "\n".join(offences))


def test_the_scanner_flags_logprob_functions_and_operations(tmp_path):
    package = tmp_path / "reef_recipe_x"
    (package / "reef_recipe_x").mkdir(parents=True)
    (package / "tests").mkdir()
    (package / "tests" / "test_oracle.py").write_text("import torch\nlp = torch.log_softmax\n")  # tests: skipped
    source = package / "reef_recipe_x" / "learner.py"
    source.write_text(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from torch.nn.functional import cross_entropy\n"
        "from reef_train import token_logprobs, vocab_logprobs\n"
        "def full_row_logprobs(model, batch):\n"
        "    return model(batch).logits.log_softmax(-1)\n"
        "def response_logp(m, ids):\n"
        "    return F.nll_loss(m(ids), ids)\n"
        "class Learner:\n"
        "    def step(self, batch):\n"
        "        weights = torch.softmax(batch, -1)\n"
        "        return token_logprobs(self.policy, batch), vocab_logprobs(self.policy, [1], [2]), weights\n"
        "    def catalog_page(self):\n"
        "        return torch.log_softmax\n"
    )
    assert package_sources(package) == [source]
    assert own_logprob_code(source) == [
        f"{source}:5: def full_row_logprobs",
        f"{source}:7: def response_logp",
        f"{source}:6: log_softmax",
        f"{source}:8: nll_loss",
        f"{source}:14: log_softmax",
    ]
