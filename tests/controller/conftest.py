"""Controller fixtures: SQLite and a throwaway PostgreSQL, a live controller (uvicorn on a free loopback
port, in the test's event loop) with the real nats-server from tests/conftest.py, and stream readers."""

from __future__ import annotations

import os
import uuid

import pytest
from ci_gate import unavailable
from controller_helpers import make_config, start_live, stop_live


@pytest.fixture(scope="session")
def pg_server():
    """(kind, handle): an existing server from JETRL_TEST_PG_URL, or a private initdb/pg_ctl cluster."""
    url = os.environ.get("JETRL_TEST_PG_URL")
    if url:
        yield ("url", url)
        return
    from testkit.devpg import TempPostgres, find_pg_bin

    if find_pg_bin() is None:
        unavailable("PostgreSQL: no server binaries (initdb/pg_ctl; apt-get install postgresql) and no JETRL_TEST_PG_URL")
    pg = TempPostgres().start()
    yield ("cluster", pg)
    pg.stop()


def _new_pg_database(pg_server) -> str:
    kind, handle = pg_server
    name = f"jetrl_{uuid.uuid4().hex[:12]}"
    if kind == "url":
        from testkit.devpg import create_database_at

        return create_database_at(handle, name)
    return handle.create_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'controller.db'}"
    return _new_pg_database(request.getfixturevalue("pg_server"))


@pytest.fixture
async def live(tmp_path, nats_config, db_url, js):
    handle = await start_live(make_config(tmp_path, nats_config, db_url))
    yield handle[0]
    await stop_live(handle)


