"""`hangdoc server` as a process, on each store: it migrates a fresh database, serves what
is stored with the token and nothing without, takes an agent's report, stops on SIGTERM
with exit 0 and comes back with its history; a database it cannot reach is one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO
from support.postgres import postgres_server, postgres_unavailable

from hangdoc.service.records import NewIncident
from hangdoc.service.store import Store

pytestmark = [pytest.mark.timeout(120)]

TOKEN = "server-cli-test-token-0123456789"


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "incidents.db")
        return
    if why := postgres_unavailable():
        pytest.skip(why)
    with postgres_server() as server:
        yield server.url


class Server:
    def __init__(self, db: str, token_file: Path, log: Path) -> None:
        self.log = log
        before = log.read_text() if log.exists() else ""
        with open(log, "a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hangdoc", "server", "--listen", "127.0.0.1:0", "--db", db,
                 "--token-file", str(token_file), "--check-interval", "1"],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (m := re.search(r"listening on port (\d+)", log.read_text()[len(before) :])):
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def call(self, path: str, token: str | None = TOKEN, body: bytes | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, data=body, method="POST" if body else "GET")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def test_the_server_serves_its_store_and_keeps_it_across_a_restart(db: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    with Store.open(db) as store:  # an incident of an earlier life of the server
        store.add(
            NewIncident(
                "10.0.0.1:29500", ("n0",), "straggler", (3,), "high", "rank 3 is not in the all_reduce", "f" * 16,
                1.0e9, 1.0e9 + 5, json.dumps({"verdict": "straggler", "culprit_ranks": [3]}), "<html></html>", b"x",
            )
        )  # fmt: skip
    log = tmp_path / "server.log"
    server = Server(db, token_file, log)
    try:
        status, body = server.call("/api/incidents")
        assert status == 200 and [(i["id"], i["verdict"], i["culprit_ranks"]) for i in body["incidents"]] == [
            (1, "straggler", [3])
        ]
        assert server.call("/api/incidents", token=None)[0] == 401
        assert server.call("/api/incidents/1", token="y" * 32)[0] == 401
        report = b'{"host": "n7", "port": 7420, "jobs": [{"job": "10.0.0.7:29500", "world_size": 2, "ranks": []}]}'
        status, answer = server.call("/api/agents/report", body=report)
        assert status == 200 and answer == {"interval": 1.0}
        status, agents = server.call("/api/agents")
        assert [(a["address"], a["node"], a["registered"]) for a in agents["agents"]] == [
            ("127.0.0.1:7420", "n7", True)
        ]
        assert server.call("/api/agents/report", body=b'{"host": 5}')[0] == 400
    finally:
        assert server.stop() == 0, log.read_text()[-2000:]
    again = Server(db, token_file, log)
    try:
        status, body = again.call("/api/incidents/1")
        assert status == 200 and body["verdict"] == "straggler" and body["state"] == "hung"
    finally:
        assert again.stop() == 0
    assert "Traceback" not in log.read_text()


def test_a_database_it_cannot_reach_is_one_line_without_the_password(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hangdoc", "server", "--db", "postgresql://alice:s3cr3t@127.0.0.1:1/none"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={k: v for k, v in os.environ.items() if k != "PGPASSWORD"},
    )  # fmt: skip
    assert out.returncode != 0 and out.stderr.startswith("hangdoc: error: ")
    assert "s3cr3t" not in out.stderr and "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.startswith("hangdoc: error")]) == 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["incidents", "--server", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
        (["incidents", "--server", "ftp://x"], "is not an http(s) URL"),
        (["agent", "--advertise", "10.0.0.1:7420"], "--advertise is for --server"),
        (["agent", "--server", "http://a:1/path"], "is not HOST:PORT or http(s)://HOST:PORT"),
        (["server", "--tls-cert", "c.pem"], "HTTPS needs both --tls-cert and --tls-key"),
        (
            ["server", "--listen", "0.0.0.0:0", "--db", "x.db"],
            "refusing to serve incidents on 0.0.0.0:0 without a token",
        ),
    ],
)
def test_wrong_use_is_one_line(argv: list[str], said: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hangdoc", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert out.returncode != 0 and out.stderr.startswith("hangdoc: error: "), out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr


def test_run_server_in_this_process_stops_on_sigterm(tmp_path: Path) -> None:
    """The server's own main loop (`run_server`), here: it serves, and the first SIGTERM
    makes it stop its loop, close the HTTP side and the store, and return 0."""
    import threading

    from hangdoc.service.loop import ServiceConfig
    from hangdoc.service.serve import ServerOptions, run_server

    ready = threading.Event()
    options = ServerOptions("127.0.0.1:0", str(tmp_path / "in.db"), ServiceConfig(check_interval=0.2))

    def poke() -> None:
        if ready.wait(30):
            os.kill(os.getpid(), signal.SIGTERM)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    threading.Thread(target=poke, daemon=True).start()
    try:
        assert run_server(options, ready) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    with Store.open(str(tmp_path / "in.db")) as store:  # migrated, closed, opened again
        assert store.list() == []
