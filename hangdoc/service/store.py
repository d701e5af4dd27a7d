"""The incident store: SQLite (a file, the default) or PostgreSQL (several servers may share
one), through SQLAlchemy Core. Its schema is migrated to the newest revision when it is
opened (alembic, ``migrations/``); every write is one transaction, so an incident is either
stored whole or not at all.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util.exc import CommandError
from sqlalchemy import URL, Engine, Row, create_engine, event, func, insert, make_url, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from ..errors import UsageError, one_line
from .records import Incident, IncidentState, NewIncident
from .schema import incident_reports, incidents

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_MS = 30_000  # a writer waits this long for another (a second server on the file)
CONNECT_TIMEOUT_S = 10  # PostgreSQL: an address that does not answer fails in this time
# the key of the PostgreSQL advisory lock under which a server migrates the schema, so that
# servers starting together on a new database migrate it one after the other ("hangdoc")
MIGRATION_LOCK = 0x68616E67646F63
MAX_ID = 2**31 - 1  # incidents.id is a 32-bit integer on PostgreSQL
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
WHERE_HELP = (
    "Give --db a SQLite file (created if absent, in a folder that exists), sqlite:///PATH, or "
    "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (PostgreSQL needs psycopg: `pip install 'psycopg[binary]'`; "
    "the password may come from PGPASSWORD or ~/.pgpass)."
)
REACH_HELP = (
    "Check that the database server is running and accepts connections at that address, and the "
    "user, password (PGPASSWORD or ~/.pgpass) and database name; the database must exist and the "
    "user may create tables in it (hangdoc creates and migrates its own)."
)
SQLITE_HELP = (
    "Give a path that is a SQLite database written by hangdoc, or a new file, that hangdoc may read and write."
)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)
_WRITE = "hangdoc_write"  # execution option: this connection's transaction will write
# alembic's `context` and `op` are process-wide proxies: one migration at a time in a process
_MIGRATING = threading.Lock()


class Store:
    """Incidents, newest first, with their reports kept apart (listing never reads them).

    Thread-safe: each call takes a pooled connection of its own.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @classmethod
    def open(cls, where: str) -> Store:
        """The store at ``where`` (a file path, ``sqlite:///PATH`` or ``postgresql://...``),
        migrated to the newest schema. A store that cannot be opened is a ``UsageError``."""
        engine = _engine(where)
        try:
            _migrate(engine)
        except CommandError as err:
            engine.dispose()
            raise UsageError(
                f"the incident store {_hidden(where)} has a schema this hangdoc does not know ({err}): "
                "a newer hangdoc wrote it",
                help="Run the hangdoc that wrote it (or a newer one), or give --db a new store.",
            ) from err
        except (SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as err:
            engine.dispose()
            raise UsageError(
                f"cannot open the incident store {_hidden(where)}: {_reason(err, where)}",
                help=SQLITE_HELP if engine.dialect.name == "sqlite" else REACH_HELP,
            ) from err
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add(self, new: NewIncident) -> Incident:
        """Store a new incident (hung) with its reports, in one transaction."""
        with self._writing() as conn:
            added = conn.execute(
                insert(incidents).values(
                    job=new.job,
                    nodes=json.dumps(list(new.nodes)),
                    verdict=new.verdict,
                    culprits=json.dumps(list(new.culprits)),
                    confidence=new.confidence,
                    summary=new.summary,
                    fingerprint=new.fingerprint,
                    detected_at=new.detected_at,
                    diagnosed_at=new.diagnosed_at,
                    state=IncidentState.HUNG.value,
                    ended_at=None,
                )
            )
            key = added.inserted_primary_key
            if key is None:  # never: every dialect here returns the new id
                raise RuntimeError("the database gave no id for the new incident")
            id_ = int(key[0])
            conn.execute(
                insert(incident_reports).values(
                    incident_id=id_, report_json=new.report_json, report_html=new.report_html, bundle=new.bundle
                )
            )
        return Incident(
            id=id_,
            job=new.job,
            nodes=new.nodes,
            verdict=new.verdict,
            culprits=new.culprits,
            confidence=new.confidence,
            summary=new.summary,
            fingerprint=new.fingerprint,
            detected_at=new.detected_at,
            diagnosed_at=new.diagnosed_at,
            state=IncidentState.HUNG,
        )

    def set_state(self, id: int, state: IncidentState, at: float) -> None:
        """The incident resumed or ended ``at`` (hung again: no end). An unknown id changes nothing."""
        ended_at = None if state is IncidentState.HUNG else at
        if not _storable(id):
            return
        with self._writing() as conn:
            conn.execute(update(incidents).where(incidents.c.id == id).values(state=state.value, ended_at=ended_at))

    # ------------------------------------------------------------------ reads

    def get(self, id: int) -> Incident | None:
        if not _storable(id):
            return None
        with self._engine.connect() as conn:
            row = conn.execute(select(incidents).where(incidents.c.id == id)).first()
        return None if row is None else _incident(row)

    def list(
        self, job: str | None = None, verdict: str | None = None, since: float | None = None, limit: int = 100
    ) -> builtins.list[Incident]:
        """Incidents newest first (by detection, then id), of ``job``, with ``verdict``,
        detected at or after ``since``; ``limit`` at most."""
        query = select(incidents)
        if job is not None:
            query = query.where(incidents.c.job == job)
        if verdict is not None:
            query = query.where(incidents.c.verdict == verdict)
        if since is not None:
            query = query.where(incidents.c.detected_at >= since)
        return self._incidents(query, limit)

    def seen_before(self, incident: Incident, limit: int = 20) -> builtins.list[Incident]:
        """The incidents stored before this one with its fingerprint, of any job, newest first."""
        query = select(incidents).where(incidents.c.fingerprint == incident.fingerprint, incidents.c.id < incident.id)
        return self._incidents(query, limit)

    def open_incidents(self) -> builtins.list[Incident]:
        """The incidents whose job is still hung, newest first."""
        return self._incidents(select(incidents).where(incidents.c.state == IncidentState.HUNG.value), None)

    def count_by_verdict(self) -> dict[str, int]:
        query = select(incidents.c.verdict, func.count()).group_by(incidents.c.verdict)
        with self._engine.connect() as conn:
            return {verdict: int(n) for verdict, n in conn.execute(query)}

    def report_json(self, id: int) -> str | None:
        found = self._report(incident_reports.c.report_json, id)
        return None if found is None else str(found)

    def report_html(self, id: int) -> str | None:
        found = self._report(incident_reports.c.report_html, id)
        return None if found is None else str(found)

    def bundle(self, id: int) -> bytes | None:
        data = self._report(incident_reports.c.bundle, id)
        return None if data is None else bytes(data)

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self._engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    def _incidents(self, query: Any, limit: int | None) -> builtins.list[Incident]:
        query = query.order_by(incidents.c.detected_at.desc(), incidents.c.id.desc())
        if limit is not None:
            query = query.limit(max(limit, 0))
        with self._engine.connect() as conn:
            return [_incident(row) for row in conn.execute(query)]

    def _report(self, column: Any, id: int) -> Any:
        if not _storable(id):
            return None
        with self._engine.connect() as conn:
            return conn.execute(select(column).where(incident_reports.c.incident_id == id)).scalar_one_or_none()


def _storable(id: int) -> bool:
    """Whether ``id`` can be an incident's: an id from a URL may be any number, and one past
    the column's range is an error in the database, not a miss."""
    return 0 < id <= MAX_ID


def _incident(row: Row[Any]) -> Incident:
    return Incident(
        id=row.id,
        job=row.job,
        nodes=tuple(json.loads(row.nodes)),
        verdict=row.verdict,
        culprits=tuple(json.loads(row.culprits)),
        confidence=row.confidence,
        summary=row.summary,
        fingerprint=row.fingerprint,
        detected_at=row.detected_at,
        diagnosed_at=row.diagnosed_at,
        state=IncidentState(row.state),
        ended_at=row.ended_at,
    )


# ---------------------------------------------------------------------- opening


def _engine(where: str) -> Engine:
    """An engine for ``where``, set up for its database; nothing is connected yet."""
    if "://" not in where:
        return _sqlite_engine(where)
    try:
        url = make_url(where)
    except (SQLAlchemyError, ValueError):
        raise UsageError(f"cannot read the incident store's URL {_hidden(where)}", help=WHERE_HELP) from None
    if url.drivername in ("sqlite", "sqlite+pysqlite"):
        if url.database in (None, "", ":memory:"):
            raise UsageError(
                f"the incident store {_hidden(where)} names no file: a store in memory would be lost", help=WHERE_HELP
            )
        return _sqlite_engine(url.database)
    if url.drivername in POSTGRES_SCHEMES:
        return _postgres_engine(url.set(drivername="postgresql+psycopg"))
    raise UsageError(
        f"the incident store {_hidden(where)} is neither a file, sqlite:// nor postgresql://", help=WHERE_HELP
    )


def _sqlite_engine(path: str) -> Engine:
    file = Path(os.path.expanduser(path))
    if not file.parent.is_dir():
        raise UsageError(
            f"the incident store's folder {file.parent} does not exist",
            help=f"Create it first (mkdir -p {file.parent}), or give --db a file in a folder that exists.",
        )
    if file.is_dir():
        raise UsageError(
            f"the incident store {file} is a folder", help=f"Give --db a file, such as {file}/incidents.db."
        )
    engine = create_engine(URL.create("sqlite+pysqlite", database=str(file)))

    @event.listens_for(engine, "connect")
    def _set_up(dbapi_connection: Any, _record: Any) -> None:
        # sqlite3 begins transactions only before DML, so DDL and reads would run outside
        # them: SQLAlchemy emits BEGIN itself (_begin); busy_timeout first, so that the
        # switch to WAL waits for a writer too
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_MS}")
            _switch_to_wal(cursor)
            cursor.execute("PRAGMA synchronous = FULL")  # a committed incident survives a power cut
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # a write transaction takes the write lock at once: a deferred one that read first
        # (the migration reads its version) would fail with SQLITE_BUSY, not wait
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def _switch_to_wal(cursor: Any) -> None:
    """Put the file in WAL mode, retrying while another connection switches it too.

    The switch takes the file's exclusive lock from a shared one; when two connections do it at
    once SQLite sees a deadlock and fails one at once, without its busy handler (three servers
    opening a new store together hit it), so the wait is here, bounded as the busy handler is.
    """
    deadline = time.monotonic() + SQLITE_BUSY_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _postgres_engine(url: URL) -> Engine:
    connect_args: dict[str, object] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        # pre-ping: a connection the server (or a failover) closed while pooled is replaced
        return create_engine(url, connect_args=connect_args, pool_pre_ping=True)
    except ImportError:
        raise UsageError(
            "a PostgreSQL incident store needs psycopg, which is not installed",
            help="Install psycopg into hangdoc's environment: `pip install 'psycopg[binary]'` (hangdoc's "
            "postgres extra: `pip install '.[postgres]'` in a clone of hangdoc).",
        ) from None


def _migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision, in one transaction that holds the database's
    write lock (SQLite) or an advisory lock (PostgreSQL), so that a second server waits and
    then finds nothing to do."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    alembic_log = logging.getLogger("alembic")
    if alembic_log.level == logging.NOTSET:  # its INFO lines (plugins, "context impl") at each start are noise
        alembic_log.setLevel(logging.WARNING)
    with _MIGRATING, engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            before = MigrationContext.configure(conn).get_current_revision()
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
            after = MigrationContext.configure(conn).get_current_revision()
    if after != before:
        log.info("incident store schema migrated from revision %s to %s", before or "none (new store)", after)


def _hidden(where: str) -> str:
    """``where`` as a message may show it: a URL's password (in its user part or as a
    ``password=`` parameter) left out."""
    if "://" not in where:
        return one_line(where)
    scheme, _, rest = where.partition("://")
    creds, at, host = rest.rpartition("@")
    if at and ":" in creds:
        rest = f"{creds.partition(':')[0]}:***@{host}"
    return one_line(_QUERY_PASSWORD.sub(r"\1***", f"{scheme}://{rest}"))


def _reason(err: BaseException, where: str) -> str:
    """The database's own words for ``err``, on one line, without the password."""
    orig = getattr(err, "orig", None)
    words = " ".join(str(orig if orig is not None else err).split())
    try:
        url = make_url(where) if "://" in where else None
    except (SQLAlchemyError, ValueError):
        url = None
    if url is not None:
        for password in (url.password, url.query.get("password")):
            if isinstance(password, str) and password:
                words = words.replace(password, "***")
    return one_line(words, 500)
