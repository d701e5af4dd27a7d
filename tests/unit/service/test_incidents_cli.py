"""`hangdoc incidents`, in this process against a real server (the HTTP side over a real
store): the table newest first with what each incident was seen before as, the filters,
--json as the API gives it, and a refused token or an unreachable server in one line."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangdoc.cli import main
from hangdoc.service.api import make_http_server
from hangdoc.service.incidents_cli import ServerError, fetch_incidents, render_incidents
from hangdoc.service.loop import HangService, ServiceConfig
from hangdoc.service.records import NewIncident
from hangdoc.service.store import Store

TOKEN = "incidents-cli-token-0123456789ab"


def _incident(job: str, verdict: str, culprits: tuple[int, ...], at: float) -> NewIncident:
    report = json.dumps({"verdict": verdict, "culprit_ranks": list(culprits)})
    return NewIncident(job, ("n0",), verdict, culprits, "high", f"{verdict} in {job}", "same-bug", at, at + 1,
                       report, "<html></html>", b"")  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    store = Store.open(str(tmp_path / "incidents.db"))
    store.add(_incident("10.0.0.1:29500", "straggler", (3,), 1.7e9))
    store.add(_incident("10.0.0.2:29500", "straggler", (5, 6, 7), 1.7e9 + 60))
    service = HangService(ServiceConfig(), store)
    http = make_http_server("127.0.0.1:0", service, TOKEN, None)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()
        service.stop(1.0)
        store.close()


def test_the_table_newest_first_with_seen_before(server: str) -> None:
    text = render_incidents(fetch_incidents(server, TOKEN, None, None, None, None, 50))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["ID", "STATE", "VERDICT", "JOB"]
    assert lines[1].split()[:5] == ["2", "hung", "straggler", "10.0.0.2:29500", "5-7"] and "#1" in lines[1]
    assert lines[2].split()[:5] == ["1", "hung", "straggler", "10.0.0.1:29500", "3"]
    assert all(line == line.rstrip() for line in lines)
    only = fetch_incidents(server, TOKEN, None, "10.0.0.1:29500", "straggler", "2020-01-01T00:00:00Z", 5)
    assert [i["id"] for i in only["incidents"]] == [1]
    assert render_incidents({"incidents": []}) == "no incident\n"


def test_the_command(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    assert main(["incidents", "--server", server, "--token-file", str(token), "--json", "--limit", "1"]) == 0
    assert [i["id"] for i in json.loads(capsys.readouterr().out)["incidents"]] == [2]
    assert main(["incidents", "--server", server, "--token-file", str(token), "--verdict", "straggler"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("2 ")


def test_a_refused_token_and_no_server_are_one_line(server: str) -> None:
    with pytest.raises(ServerError, match="answered 401") as refused:
        fetch_incidents(server, "wrong-token-0123456789abcdef", None, None, None, None, 5)
    assert "\n" not in str(refused.value)
    with pytest.raises(ServerError, match="cannot reach"):
        fetch_incidents("http://127.0.0.1:1", None, None, None, None, None, 5)
