"""The incident store on SQLite (a file in tmp_path) and on a real PostgreSQL (a throwaway
server for the module, a fresh database per test; skipped with the reason where PostgreSQL
or psycopg is missing): every method, a restart, the migration (idempotent, safe when two
servers open one new database together, ending at exactly schema.py's tables), and the
errors of a store that cannot be opened, none of which shows a password.
"""

from __future__ import annotations

import itertools
import json
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from support.paths import REPO
from support.postgres import PostgresServer, postgres_server, postgres_unavailable

from hangdoc.errors import UsageError
from hangdoc.service import store as store_module
from hangdoc.service.records import Incident, IncidentState, NewIncident
from hangdoc.service.schema import metadata
from hangdoc.service.store import Store

pytestmark = [pytest.mark.timeout(120)]

T0 = 1_795_000_000.0
PASSWORD = "s3cret-Pa55word"
BUNDLE = bytes(range(256)) * 64 + b"\x1f\x8b\x00"  # every byte value, NUL included
_databases = itertools.count()


def new(
    job: str = "10.0.0.1:29500",
    verdict: str = "collective_mismatch",
    fingerprint: str = "fp-a",
    detected_at: float = T0,
    **more: object,
) -> NewIncident:
    value = NewIncident(
        job=job,
        nodes=("node-a", "node-b"),
        verdict=verdict,
        culprits=(3, 7),
        confidence="high",
        summary=f"{verdict} on {job}",
        fingerprint=fingerprint,
        detected_at=detected_at,
        diagnosed_at=detected_at + 12.5,
        report_json=json.dumps({"verdict": verdict}),
        report_html="<html><body>ranks 3, 7 — «hung»</body></html>",
        bundle=BUNDLE,
    )
    return replace(value, **more)  # type: ignore[arg-type]


def ids(incidents: list[Incident]) -> list[int]:
    return [i.id for i in incidents]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a new, empty store is: a SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return str(tmp_path / "incidents.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"store_{next(_databases)}")


@pytest.fixture
def store(where: str) -> Iterator[Store]:
    with Store.open(where) as opened:
        yield opened


@contextmanager
def connected(where: str) -> Iterator[sa.Connection]:
    """A plain connection to the store's database, beside the store's own."""
    url = where.replace("postgresql://", "postgresql+psycopg://", 1) if "://" in where else f"sqlite:///{where}"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


# ---------------------------------------------------------------------- each method


def test_an_added_incident_is_hung_and_reads_back_whole(store: Store) -> None:
    added = store.add(new())
    assert added.state is IncidentState.HUNG and added.ended_at is None
    assert added.nodes == ("node-a", "node-b") and added.culprits == (3, 7)
    assert store.get(added.id) == added
    assert store.report_json(added.id) == '{"verdict": "collective_mismatch"}'
    assert store.report_html(added.id) == "<html><body>ranks 3, 7 — «hung»</body></html>"
    data = store.bundle(added.id)
    assert type(data) is bytes and data == BUNDLE
    second = store.add(new(job="pid:1", bundle=b"", culprits=(), nodes=()))
    assert second.id > added.id
    assert store.get(second.id) == second and store.bundle(second.id) == b""


def test_an_unknown_id_is_none(store: Store) -> None:
    store.add(new())
    for unknown in (0, 99, -1, 2**31, 2**63, 10**30):  # ids from a URL may be any number
        assert store.get(unknown) is None
        assert store.report_json(unknown) is None
        assert store.report_html(unknown) is None
        assert store.bundle(unknown) is None


def test_the_list_is_newest_first_by_detection_then_id(store: Store) -> None:
    late = store.add(new(detected_at=T0 + 300))
    early = store.add(new(detected_at=T0 + 100))
    tie_a = store.add(new(detected_at=T0 + 200))
    tie_b = store.add(new(detected_at=T0 + 200))
    assert ids(store.list()) == [late.id, tie_b.id, tie_a.id, early.id]
    assert ids(store.list(limit=2)) == [late.id, tie_b.id]
    assert store.list(limit=0) == []
    assert Store.list.__defaults__ == (None, None, None, 100)


def test_the_list_filters(store: Store) -> None:
    a1 = store.add(new(job="a:1", verdict="straggler", detected_at=T0))
    b1 = store.add(new(job="b:1", verdict="straggler", detected_at=T0 + 10))
    a2 = store.add(new(job="a:1", verdict="collective_mismatch", detected_at=T0 + 20))
    assert ids(store.list(job="a:1")) == [a2.id, a1.id]
    assert ids(store.list(verdict="straggler")) == [b1.id, a1.id]
    assert ids(store.list(since=T0 + 10)) == [a2.id, b1.id]  # at `since` counts
    assert ids(store.list(job="a:1", verdict="straggler")) == [a1.id]
    assert ids(store.list(job="a:1", since=T0 + 1, limit=5)) == [a2.id]
    assert store.list(job="nobody:0") == [] and store.list(verdict="deadlock") == []
    assert store.list(since=T0 + 21) == []


def test_seen_before_is_the_earlier_ones_with_the_fingerprint_of_any_job(store: Store) -> None:
    first = store.add(new(job="a:1", fingerprint="fp-x", detected_at=T0))
    other = store.add(new(job="a:1", fingerprint="fp-y", detected_at=T0 + 5))
    second = store.add(new(job="b:1", fingerprint="fp-x", detected_at=T0 + 10))
    third = store.add(new(job="c:1", fingerprint="fp-x", detected_at=T0 + 20))
    fourth = store.add(new(job="a:1", fingerprint="fp-x", detected_at=T0 + 30))
    assert store.seen_before(first) == []
    assert store.seen_before(other) == []
    assert ids(store.seen_before(second)) == [first.id]
    assert ids(store.seen_before(fourth)) == [third.id, second.id, first.id]  # newest first
    assert ids(store.seen_before(fourth, limit=2)) == [third.id, second.id]
    assert ids(store.seen_before(third)) == [second.id, first.id]  # never a later one


def test_states_end_and_open_incidents(store: Store) -> None:
    a = store.add(new(job="a:1", detected_at=T0))
    b = store.add(new(job="b:1", detected_at=T0 + 10))
    c = store.add(new(job="c:1", detected_at=T0 + 20))
    assert ids(store.open_incidents()) == [c.id, b.id, a.id]
    store.set_state(a.id, IncidentState.RESUMED, T0 + 60)
    store.set_state(b.id, IncidentState.ENDED, T0 + 70)
    assert ids(store.open_incidents()) == [c.id]
    assert store.get(a.id) == replace(a, state=IncidentState.RESUMED, ended_at=T0 + 60)
    assert store.get(b.id) == replace(b, state=IncidentState.ENDED, ended_at=T0 + 70)
    store.set_state(a.id, IncidentState.HUNG, T0 + 90)  # hung again: no end
    assert store.get(a.id) == a
    for unknown in (12345, 10**30):  # unknown: nothing changes
        store.set_state(unknown, IncidentState.ENDED, T0)
    assert ids(store.list()) == [c.id, b.id, a.id]


def test_count_by_verdict(store: Store) -> None:
    assert store.count_by_verdict() == {}
    for verdict in ("straggler", "collective_mismatch", "straggler", "deadlock", "straggler"):
        store.add(new(verdict=verdict))
    store.set_state(1, IncidentState.ENDED, T0)  # every incident counts, ended ones too
    assert store.count_by_verdict() == {"straggler": 3, "collective_mismatch": 1, "deadlock": 1}


def test_concurrent_adds_each_get_their_own_id(store: Store) -> None:
    failures: list[BaseException] = []
    added: list[Incident] = []

    def add_some(job: str) -> None:
        try:
            for n in range(10):
                added.append(store.add(new(job=job, detected_at=T0 + n)))
        except BaseException as err:  # noqa: BLE001 - reported by the test
            failures.append(err)

    threads = [threading.Thread(target=add_some, args=(f"job{t}:1",)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert len({i.id for i in added}) == 40
    assert sorted(ids(store.list(limit=100))) == sorted(i.id for i in added)


def test_a_failed_add_stores_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = store.add(new())
    # the reports go to a table that does not exist: the incident's own row is rolled back
    missing = sa.table(
        "no_such_table", *(sa.column(c) for c in ("incident_id", "report_json", "report_html", "bundle"))
    )
    monkeypatch.setattr(store_module, "incident_reports", missing)
    with pytest.raises(sa.exc.SQLAlchemyError):
        store.add(new(job="lost:1"))
    monkeypatch.undo()
    assert store.list() == [kept]
    assert ids(store.list()) == [kept.id]


# ---------------------------------------------------------------------- restarts, migration


def test_a_reopened_store_keeps_its_incidents(where: str) -> None:
    with Store.open(where) as first:
        a = first.add(new(job="a:1"))
        b = first.add(new(job="b:1", detected_at=T0 + 5))
        first.set_state(a.id, IncidentState.ENDED, T0 + 9)
    with Store.open(where) as again:
        assert again.get(b.id) == b
        assert again.get(a.id) == replace(a, state=IncidentState.ENDED, ended_at=T0 + 9)
        assert again.bundle(b.id) == BUNDLE
        assert again.report_json(b.id) == new(job="b:1").report_json
        assert ids(again.open_incidents()) == [b.id]
        c = again.add(new(job="c:1"))
        assert c.id > b.id  # ids are not reused


def test_an_incident_committed_before_a_crash_is_kept(where: str) -> None:
    # a process that stores an incident, then is killed before it closes anything
    code = (
        "import os, signal, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from hangdoc.service.store import Store\n"
        "from hangdoc.service.records import NewIncident\n"
        "s = Store.open(sys.argv[1])\n"
        "i = s.add(NewIncident('crash:1', ('n',), 'straggler', (1,), 'high', 's', 'fp', 1.0, 2.0, '{}', '', b'z'))\n"
        "print(i.id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, where, str(REPO)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -9, done.stderr
    with Store.open(where) as after:
        found = after.get(int(done.stdout))
        assert found is not None and found.job == "crash:1" and after.bundle(found.id) == b"z"


def test_the_migration_runs_once_however_often_the_store_is_opened(where: str) -> None:
    for _ in range(3):
        with Store.open(where) as opened:
            opened.add(new())
    with connected(where) as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == ["0001"]
        assert conn.execute(sa.text("SELECT count(*) FROM incidents")).scalar_one() == 3


def test_the_migrations_make_exactly_the_schema_module(where: str) -> None:
    Store.open(where).close()
    with connected(where) as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        inspector = sa.inspect(conn)
        assert set(inspector.get_table_names()) == {"alembic_version", "incidents", "incident_reports"}
        indexed = {tuple(ix["column_names"]) for ix in inspector.get_indexes("incidents")}
        assert indexed == {("detected_at",), ("job",), ("fingerprint",)}


# a server process: imports, says it is ready, waits for the word, then opens the store
# (migrating it) and adds one incident
SERVER = """
import sys
sys.path.insert(0, sys.argv[2])
from hangdoc.service.store import Store
from hangdoc.service.records import NewIncident
print("ready", flush=True)
sys.stdin.readline()
with Store.open(sys.argv[1]) as s:
    s.add(NewIncident(sys.argv[3], (), "straggler", (), "high", "", "fp", 1.0, 2.0, "{}", "", b""))
"""


def test_servers_opening_one_new_store_together_all_migrate_it(where: str) -> None:
    jobs = [f"server{n}:1" for n in range(3)]
    servers = [
        subprocess.Popen(
            [sys.executable, "-c", SERVER, where, str(REPO), job],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    try:
        for server in servers:
            assert server.stdout is not None and server.stdout.readline() == "ready\n"
        for server in servers:  # all at once: each migration races the others
            assert server.stdin is not None
            server.stdin.write("go\n")
            server.stdin.flush()
        outcomes = [(server.communicate(timeout=90)[1], server.returncode) for server in servers]
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait(10)
            for pipe in (server.stdin, server.stdout, server.stderr):
                if pipe is not None:
                    pipe.close()
    assert [rc for _, rc in outcomes] == [0, 0, 0], [err[-2000:] for err, _ in outcomes]
    with Store.open(where) as opened:
        assert sorted(i.job for i in opened.list()) == jobs
    with connected(where) as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == ["0001"]


def test_a_migration_waits_for_another_servers(postgres: PostgresServer) -> None:
    url = postgres.create_database("locked")
    opened: list[Store] = []
    opening = threading.Thread(target=lambda: opened.append(Store.open(url)))
    try:
        with connected(url) as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": store_module.MIGRATION_LOCK})
            opening.start()
            opening.join(1.5)
            assert opening.is_alive() and opened == []  # held back by the lock another server holds
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": store_module.MIGRATION_LOCK})
            conn.commit()
            opening.join(30)
        assert len(opened) == 1 and opened[0].list() == []
    finally:
        opening.join(30)  # the lock goes with the connection: the open ends either way
        for store in opened:
            store.close()


def test_threads_opening_one_new_store_together_all_succeed(where: str) -> None:
    barrier = threading.Barrier(4, timeout=30)
    outcomes: list[BaseException | None] = []

    def open_and_add(n: int) -> None:
        try:
            barrier.wait()
            with Store.open(where) as opened:
                opened.add(new(job=f"thread{n}:1"))
            outcomes.append(None)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            outcomes.append(err)

    threads = [threading.Thread(target=open_and_add, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes == [None] * 4
    with Store.open(where) as opened:
        assert sorted(i.job for i in opened.list()) == [f"thread{n}:1" for n in range(4)]


def test_a_store_from_a_newer_hangdoc_is_refused(where: str) -> None:
    Store.open(where).close()
    with connected(where) as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
        conn.commit()
    with pytest.raises(UsageError, match="newer hangdoc") as caught:
        Store.open(where)
    assert "9999" in str(caught.value)


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    with Store.open(f"sqlite:///{path}") as opened:
        opened.add(new())
        with opened._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() > 0
    raw = sqlite3.connect(path)  # the journal mode is the file's own
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()


def test_a_postgres_url_works_as_postgresql_too(postgres: PostgresServer) -> None:
    url = postgres.create_database("short_scheme")
    with Store.open(url.replace("postgresql://", "postgres://", 1)) as opened:
        added = opened.add(new())
    with Store.open(url.replace("postgresql://", "postgresql+psycopg://", 1)) as opened:
        assert opened.get(added.id) == added


# ---------------------------------------------------------------------- errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(where: str, match: str) -> UsageError:
    with pytest.raises(UsageError, match=match) as caught:
        Store.open(where)
    err = caught.value
    assert PASSWORD not in str(err) and PASSWORD not in err.help
    assert "\n" not in str(err) and err.help
    return err


def test_a_url_of_another_scheme_is_a_usage_error() -> None:
    err = _refused(f"mysql://hangdoc:{PASSWORD}@db.example:3306/incidents", "neither a file")
    assert "mysql://hangdoc:***@db.example:3306/incidents" in str(err)
    _refused(f"postgresql+asyncpg://u:{PASSWORD}@h/db", "neither a file")
    _refused(f"postgresql://u:{PASSWORD}@h:notaport/db", "cannot read")
    err = _refused(f"mysql://db.example/incidents?user=u&password={PASSWORD}&x=1", "neither a file")
    assert "?user=u&password=***&x=1" in str(err)


def test_a_store_in_memory_is_refused() -> None:
    for where in ("sqlite://", "sqlite:///:memory:"):
        _refused(where, "names no file")


def test_an_unreachable_postgres_is_a_usage_error() -> None:
    port = _free_port()
    err = _refused(f"postgresql://hangdoc:{PASSWORD}@127.0.0.1:{port}/incidents", "incident store")
    if "psycopg" not in str(err):  # without psycopg, the error says to install it
        assert "cannot open the incident store postgresql://hangdoc:***@127.0.0.1" in str(err)
        assert "refused" in str(err)
    _refused(f"postgresql://127.0.0.1:{port}/incidents?user=hangdoc&password={PASSWORD}", "incident store")


def test_a_missing_database_is_a_usage_error(postgres: PostgresServer) -> None:
    url = postgres.url_of("no_such_database").replace("postgres@", f"postgres:{PASSWORD}@")
    err = _refused(url, "cannot open")
    assert "no_such_database" in str(err)


def test_a_missing_folder_or_a_folder_or_not_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "incidents.db"
    err = _refused(str(missing), "does not exist")
    assert f"mkdir -p {missing.parent}" in err.help
    _refused(f"sqlite:///{missing}", "does not exist")
    assert not missing.parent.exists()
    _refused(str(tmp_path), "is a folder")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is no database " * 100)
    _refused(str(junk), "not a database")


def test_opening_a_new_file_while_another_connection_writes_it_waits_for_the_switch_to_wal(tmp_path: Path) -> None:
    # SQLite fails the switch to WAL at once, busy_timeout or not, while another connection
    # holds the file's write lock (how three servers opening one new store together failed)
    where = tmp_path / "incidents.db"
    other = sqlite3.connect(where, isolation_level=None, check_same_thread=False)
    try:
        other.execute("CREATE TABLE unrelated (a)")
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO unrelated VALUES (1)")
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # SQLite's own behaviour
            raw = sqlite3.connect(where, isolation_level=None, timeout=5)
            try:
                raw.execute("PRAGMA journal_mode = WAL")
            finally:
                raw.close()
        release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
        release.start()
        with Store.open(str(where)) as opened:
            assert opened.list() == []
        release.join()
    finally:
        other.close()
    with closing(sqlite3.connect(where)) as fresh:
        assert fresh.execute("PRAGMA journal_mode").fetchone() == ("wal",)
