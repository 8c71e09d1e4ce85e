"""The `reef` command line: records, plugins, errors, and the shape of its package."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import reef_core.cli
from reef_core.cli import main
from reef_core.store import Record, RecordStore, Report


def _seed(state_dir) -> None:
    store = RecordStore(f"sqlite:///{state_dir / 'reef.db'}")
    store.add_records([
        Record(id=f"r{i}", scenario="support", model="m", request={"messages": [{"role": "user", "content": str(i)}]},
               response={"choices": [{"message": {"content": f"a{i}"}}]}, status="ok" if i % 2 == 0 else "error")
        for i in range(4)
    ])
    body = {"score": 0.0, "feedback": "too long", "references": ["r2"]}
    store.add_report(Report(id="rep", scenario="support", score=0.0, feedback="too long", references=["r2"],
                            body_hash=RecordStore.report_body_hash(body)))
    store.close()


def test_records_list_show_export(tmp_path):
    _seed(tmp_path)
    runner = CliRunner()
    over = [f"server.state_dir={tmp_path}"]

    listed = runner.invoke(main, ["records", "list", "-s", "support", *over])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == ["r3", "r2", "r1", "r0"]
    assert "reports=1 score=0" in lines[1]

    errors = runner.invoke(main, ["records", "list", "-s", "support", "--status", "error", *over])
    assert [ln.split()[0] for ln in errors.output.strip().splitlines()] == ["r3", "r1"]

    shown = runner.invoke(main, ["records", "show", "r2", *over])
    data = json.loads(shown.output)
    assert data["id"] == "r2" and data["reports"][0]["feedback"] == "too long"

    out = tmp_path / "export.jsonl"
    exported = runner.invoke(main, ["records", "export", "-s", "support", "-o", str(out), *over])
    assert exported.exit_code == 0, exported.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["r0", "r1", "r2", "r3"]
    assert rows[2]["reports"][0]["score"] == 0.0


def test_records_commands_refuse_odd_arguments_in_one_line(tmp_path):
    _seed(tmp_path)
    runner = CliRunner()
    over = [f"server.state_dir={tmp_path}"]
    for args in (["list", "-n", "9223372036854775808"], ["list", "-n", "0"], ["list", "-s", ""], ["export", "-s", "a/b"]):
        result = runner.invoke(main, ["records", *args, *over])
        assert result.exit_code == 2 and "Traceback" not in result.output, (args, result.output)
    stale = tmp_path / "old.jsonl"
    stale.write_text('{"stale": true}\n')
    emptied = runner.invoke(main, ["records", "export", "-s", "nobody", "-o", str(stale), *over])
    assert emptied.exit_code == 0 and stale.read_text() == ""  # no record: an empty export, not the old lines
    typo = runner.invoke(main, ["records", "list", f"server.state_dir={tmp_path / 'typo'}"])
    assert typo.exit_code == 1 and "no record store in" in typo.output
    assert not (tmp_path / "typo").exists()  # a reader creates no store where none was


def test_unknown_record_is_a_clean_error(tmp_path):
    _seed(tmp_path)
    result = CliRunner().invoke(main, ["records", "show", "nope", f"server.state_dir={tmp_path}"])
    assert result.exit_code == 1
    assert "no record with receipt 'nope'" in result.output
    assert "Traceback" not in result.output


def test_plugins_json_lists_builtins():
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0
    names = {p["name"] for p in json.loads(result.output)}
    assert "reef_core.builtins.basic" in names


CLI_MODULES = sorted(m.name for m in pkgutil.iter_modules(reef_core.cli.__path__))
#: the package's modules every command group may import: nothing else of the package
SHARED = {"common", "remote"}


def test_the_cli_package_has_its_command_groups():
    assert {"common", "serve", "records", "learning", "status", "agent", "remote"} <= set(CLI_MODULES)


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_cli_module_imports_first_in_a_fresh_interpreter(module):
    """No import cycle between the command groups: each imports on its own, whichever comes first."""
    done = subprocess.run([sys.executable, "-c", f"import reef_core.cli.{module}"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def _package_imports(path: Path) -> set[str]:
    """The modules of ``reef_core.cli`` that ``path`` imports (relative imports of level 1)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return found


@pytest.mark.parametrize("module", [m for m in CLI_MODULES if m not in SHARED])
def test_a_command_group_imports_only_the_shared_modules(module):
    path = Path(reef_core.cli.__path__[0]) / f"{module}.py"
    assert _package_imports(path) <= SHARED, f"reef_core.cli.{module} imports another command group"


def test_the_shared_modules_import_no_command_group():
    for module in SHARED:
        assert _package_imports(Path(reef_core.cli.__path__[0]) / f"{module}.py") <= SHARED - {module}



def _commands_with_overrides(group: click.Group = main, path: tuple[str, ...] = ()):
    """Every command taking config overrides as trailing arguments, with its required arguments."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands_with_overrides(command, (*path, name))
            continue
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        if any(a.name == "overrides" for a in arguments):
            yield (*path, name), ["x" for a in arguments if a.required and a.name != "overrides"], command


@pytest.mark.parametrize("path, required, command", list(_commands_with_overrides()),
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_a_word_that_is_not_an_override_says_what_it_was_taken_as(tmp_path, path, required, command):
    result = CliRunner().invoke(main, [*path, *required, "foo", f"server.state_dir={tmp_path}"], prog_name="reef")
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "Error parsing override" not in line
    assert line.startswith("Error: 'foo' was taken as a config override, and an override is KEY=VALUE")
    assert f"`reef {' '.join(path)}` takes no further arguments" in line
    takes_scenario = any("--scenario" in getattr(p, "opts", ()) for p in command.params)
    assert ("use -s foo" in line) == takes_scenario


def test_an_unknown_key_given_on_the_command_line_is_named_as_the_docs_say(tmp_path):
    result = CliRunner().invoke(main, ["serve", "server.prot=1", f"server.state_dir={tmp_path}"], prog_name="reef")
    assert result.exit_code == 2
    assert result.output.strip() == "Error: unknown config key server.prot"
    assert "`Error: unknown config key server.prot`" in (Path(__file__).parents[1] / "docs/configuration.md").read_text()
