"""A real, throwaway PostgreSQL server for tests: Debian's ``postgresql`` package (or any
``initdb``/``pg_ctl``/``postgres`` on PATH), started in a fresh temporary folder.

``postgres_server()`` runs ``initdb --auth=trust`` there and starts the server with
``pg_ctl -w`` (it returns once the server accepts connections), listening on a unix socket
in that folder and on 127.0.0.1 at a free port, with ``fsync=off`` (nothing here must
survive a power cut). As root, every command runs as the ``postgres`` system user
(PostgreSQL refuses to run as root), and the folder is that user's. On leaving the block,
an exception included, the server is stopped (``pg_ctl stop -m immediate``) and the folder
removed.

``postgres_unavailable()`` says why no server can be started here (tests skip with it);
``find_postgres()`` is the folder holding the server's programs.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROGRAMS = ("initdb", "pg_ctl", "postgres")
USER = "postgres"  # the database superuser initdb creates, and the system user that runs it as root
COMMAND_TIMEOUT_S = 120
START_TRIES = 3  # a free port found can be taken before the server binds it: try another


def find_postgres() -> Path | None:
    """The folder with initdb, pg_ctl and postgres: PATH first, then Debian's newest."""
    folders = []
    on_path = shutil.which("initdb")
    if on_path is not None:
        folders.append(Path(on_path).resolve().parent)
    debian = Path("/usr/lib/postgresql").glob("*/bin")
    folders += sorted(debian, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    for folder in folders:
        if all(os.access(folder / name, os.X_OK) for name in PROGRAMS):
            return folder
    return None


def postgres_unavailable() -> str | None:
    """Why no test server can be started here; None when it can."""
    if find_postgres() is None:
        return "PostgreSQL is not installed (initdb, pg_ctl, postgres: apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            return f"running as root, and there is no {USER!r} system user to run PostgreSQL as"
    return None


@dataclass(frozen=True)
class PostgresServer:
    """A running test server; ``url`` names its database made for the tests."""

    port: int
    folder: Path
    database: str

    @property
    def url(self) -> str:
        return self.url_of(self.database)

    def url_of(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database on this server; its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url_of("postgres"), autocommit=True, connect_timeout=30) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_of(name)


@contextmanager
def postgres_server(database: str = "hangdoc") -> Iterator[PostgresServer]:
    """A started server holding an empty ``database``; stopped and removed on exit."""
    bin_dir = find_postgres()
    if bin_dir is None:
        raise RuntimeError(postgres_unavailable() or "PostgreSQL is not installed")
    folder = Path(tempfile.mkdtemp(prefix="hangdoc-pg-"))
    data = folder / "data"
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(USER)
            os.chown(folder, user.pw_uid, user.pw_gid)
        _run(
            [str(bin_dir / "initdb"), "-D", str(data), f"--username={USER}", "--auth=trust"]
            + ["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            folder,
        )
        port = 0
        for attempt in range(START_TRIES):
            port = _free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off -c full_page_writes=off"
            start = [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "60"]
            done = _run([*start, "-o", options, "start"], folder, check=False)
            if done.returncode == 0:
                break
            if attempt == START_TRIES - 1:
                log = (folder / "log").read_text(errors="replace") if (folder / "log").exists() else ""
                raise RuntimeError(f"PostgreSQL did not start: {done.stdout}{done.stderr}\n{log[-3000:]}")
        server = PostgresServer(port=port, folder=folder, database=database)
        server.create_database(database)
        yield server
    finally:
        if (data / "postmaster.pid").exists():  # started, even if pg_ctl gave up waiting for it
            _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], folder, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _as_server_user(command: Sequence[str]) -> list[str]:
    if os.geteuid() != 0:
        return list(command)
    if shutil.which("runuser") is not None:
        return ["runuser", "-u", USER, "--", *command]
    return ["su", "-s", "/bin/sh", USER, "-c", shlex.join(command)]


def _run(command: Sequence[str], folder: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    # the folder as the working directory: root's own may be closed to the postgres user
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    done = subprocess.run(
        _as_server_user(command),
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
