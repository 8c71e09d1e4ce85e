"""``reef releases``, ``reef rollback`` and ``reef grow`` on a local state directory."""

from __future__ import annotations

from click.testing import CliRunner

from reef_core.cli import main
from reef_core.store import RecordStore

from .conftest import feedback_rules_config, write_config
from .test_recovery import Down, _seed


def _invoke(tmp_path, *args: str):
    cfg = write_config(tmp_path / "cli.yaml", feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                   evaluator={"name": "always"}))
    return CliRunner().invoke(main, [*args, "-c", str(cfg), f"server.state_dir={tmp_path / 'state'}",
                                     f"runtime.upstream_url={Down.url}"])


def test_grow_releases_and_rollback(tmp_path):
    empty = _invoke(tmp_path, "releases")
    assert empty.exit_code == 0 and "scenario 'default' has no releases yet" in empty.output
    nothing = _invoke(tmp_path, "grow")
    assert nothing.exit_code == 0 and "default: nothing: no eligible experience" in nothing.output

    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    for feedback in ("Be brief", "Cite sources"):
        _seed(store, feedback)
        grown = _invoke(tmp_path, "grow", "-s", "default")
        assert grown.exit_code == 0 and "published (candidate cand_" in grown.output
    first, second = reversed(store.list_releases("default"))

    table = _invoke(tmp_path, "releases", "-s", "default")
    assert table.exit_code == 0
    assert first.release_id in table.output and second.release_id in table.output and "(head)" in table.output

    bad = _invoke(tmp_path, "rollback", "-s", "default", "rel_nope")
    assert bad.exit_code == 1 and "Error: scenario 'default' has no release 'rel_nope'" in bad.output

    back = _invoke(tmp_path, "rollback", "-s", "default", first.release_id)
    assert back.exit_code == 0 and f"rollback to {first.release_id}" in back.output
    head = store.head_release("default")
    assert head.sequence == 3 and head.content_hash == first.content_hash
    store.close()
