"""The `reef` command line: records, plugins, errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

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
