"""Suite-wide settings and fixtures: offline model libraries, PostgreSQL, isolated state."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(autouse=True)
def _fresh_plugins(monkeypatch):
    """Each test loads plugins anew, and never inherits a REEF_PLUGINS from the shell."""
    from reef_core.plugins import reset_plugins

    monkeypatch.delenv("REEF_PLUGINS", raising=False)
    monkeypatch.delenv("REEF_TOKEN", raising=False)
    reset_plugins()
    yield
    reset_plugins()


@pytest.fixture(autouse=True)
def _own_servers_dir(monkeypatch, tmp_path_factory):
    """Servers a test starts record the directory they serve from in a directory of the test's
    own (``reef_core.served_dirs``), not the user's, and a CLI run in a test finds only those."""
    monkeypatch.setenv("REEF_SERVERS_DIR", str(tmp_path_factory.mktemp("servers")))


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the PostgreSQL server that scripts/test starts.

    Under CI a missing server is a failure, not a skip: the store must be tested on both.
    """
    url = os.environ.get("REEF_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("REEF_TEST_POSTGRES_URL is not set; run the suite through scripts/test")
        pytest.skip("no PostgreSQL server (run the suite through scripts/test)")
    return url


@pytest.fixture
def fresh_pg_url(postgres_url: str) -> str:
    """A new, empty database on the test server, dropped afterwards."""
    import uuid

    import sqlalchemy as sa

    from reef_core.store.engine import normalize_url

    name = f"reef_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(postgres_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = normalize_url(postgres_url).rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as c:
        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    """Every wheel of the repository, built once per run (tests.wheelhouse.build_wheelhouse).

    Its tests carry ``xdist_group("wheels")``: under pytest-xdist they run on one worker, which
    builds it once."""
    from tests.wheelhouse import build_wheelhouse

    return build_wheelhouse(tmp_path_factory)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    """The same store tests run on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reef.db'}"
    return request.getfixturevalue("fresh_pg_url")
