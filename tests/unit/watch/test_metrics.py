"""The watch's Prometheus metrics, rendered by ``prometheus_client`` from a private registry
and read back with the library's own parsers: the HTTP page of a running watch (a real
``hangdoc watch`` process wrapping a real command that steps, then goes silent), the
textfile for node_exporter (atomic rewrites, removed when the watch ends), and the names,
types and labels that docs/watch.md documents."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from support.said import Said, silent

from hangdoc import __version__
from hangdoc.errors import UsageError
from hangdoc.watch import metrics
from hangdoc.watch.config import Level
from hangdoc.watch.metrics import MetricsBoard, Textfile, identity, render, serve, textfile_path

HOST = socket.gethostname()
IDENTITY = {"hostname": "node7", "slurm_job_id": "4242", "slurm_job": "train"}

# every family and its type, as the text format (0.0.4) says it: an info metric is a gauge
# there, named with its _info suffix; counters are named without _total
FAMILIES = {
    "hangdoc_watch_info": "gauge",
    "hangdoc_watch_steps_seen": "gauge",
    "hangdoc_watch_last_step": "gauge",
    "hangdoc_watch_last_step_timestamp_seconds": "gauge",
    "hangdoc_watch_steps_per_second": "gauge",
    "hangdoc_watch_step_rate": "gauge",
    "hangdoc_watch_silence_seconds": "gauge",
    "hangdoc_watch_stall_timeout_seconds": "gauge",
    "hangdoc_watch_stalled": "gauge",
    "hangdoc_watch_suspected": "counter",
    "hangdoc_watch_dismissed": "counter",
    "hangdoc_watch_reports": "counter",
    "hangdoc_watch_diagnoses": "counter",
}


def _samples(text: str) -> dict[str, list]:
    """sample name -> its samples, from the text format, through the library's parser."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _one(samples: dict[str, list], name: str):
    assert len(samples[name]) == 1, samples[name]
    return samples[name][0]


def _board() -> MetricsBoard:
    board = MetricsBoard(IDENTITY)
    board.update(
        signal="heartbeat",
        steps_seen=12,
        last_step=11,
        stalled=True,
        silence_seconds=4.5,
        last_step_time=1795330123.457,
        step_rate=2.5,
        stall_timeout_seconds=30.0,
    )
    board.count_diagnosis("straggler")
    board.count_diagnosis("straggler")
    board.count_diagnosis("failed")
    board.count("suspected_total")
    board.count("reports_total")
    return board


# ------------------------------------------------------------------ names, types, labels


@pytest.mark.timeout(30)
def test_page_names_types_labels_and_values() -> None:
    text = render(_board())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {name: f.type for name, f in families.items()} == FAMILIES
    assert all(f.documentation for f in families.values())
    samples = _samples(text)
    for name, found in samples.items():
        assert name.startswith("hangdoc_watch_")
        for sample in found:  # whose job: on every series, as NCCL Inspector labels its own
            assert {k: sample.labels[k] for k in IDENTITY} == IDENTITY, sample
    info = _one(samples, "hangdoc_watch_info")
    assert info.value == 1 and info.labels == {**IDENTITY, "signal": "heartbeat", "version": __version__}
    assert _one(samples, "hangdoc_watch_steps_seen").value == 12
    assert _one(samples, "hangdoc_watch_last_step").value == 11
    assert _one(samples, "hangdoc_watch_last_step_timestamp_seconds").value == 1795330123.457
    assert _one(samples, "hangdoc_watch_steps_per_second").value == 2.5
    assert _one(samples, "hangdoc_watch_step_rate").value == 2.5  # the old name, kept for dashboards
    assert _one(samples, "hangdoc_watch_silence_seconds").value == 4.5
    assert _one(samples, "hangdoc_watch_stall_timeout_seconds").value == 30
    assert _one(samples, "hangdoc_watch_stalled").value == 1
    assert _one(samples, "hangdoc_watch_suspected_total").value == 1
    assert _one(samples, "hangdoc_watch_reports_total").value == 1
    assert _one(samples, "hangdoc_watch_dismissed_total").value == 0
    by_verdict = {s.labels["verdict"]: s.value for s in samples["hangdoc_watch_diagnoses_total"]}
    assert by_verdict == {"straggler": 2, "failed": 1}
    assert not any(name.endswith("_created") for name in samples)  # counters without creation times


@pytest.mark.timeout(30)
def test_page_before_any_step() -> None:
    samples = _samples(render(MetricsBoard()))
    assert "hangdoc_watch_last_step" not in samples  # absent until a step said its number
    assert "hangdoc_watch_last_step_timestamp_seconds" not in samples
    assert _one(samples, "hangdoc_watch_info").labels["signal"] == "none"
    assert _one(samples, "hangdoc_watch_stalled").labels["slurm_job_id"] == "unknown"
    assert [(s.labels["verdict"], s.value) for s in samples["hangdoc_watch_diagnoses_total"]] == [("none", 0)]


def test_identity_labels() -> None:
    assert identity(None, {}, "h") == {"hostname": "h", "slurm_job_id": "unknown", "slurm_job": "unknown"}
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "pretrain"}
    assert identity("pid:42", env, "h") == {"hostname": "h", "slurm_job_id": "77", "slurm_job": "pretrain"}
    # a slurm: spec names the job, whatever the watch's own environment says; its step is no part of the id
    assert identity("slurm:1234.0", env, "h")["slurm_job_id"] == "1234"
    assert identity(None, {})["hostname"] == HOST


def test_registry_is_private() -> None:
    boards = [_board(), MetricsBoard()]  # two boards in one process do not clash
    assert prometheus_client.REGISTRY.get_sample_value("hangdoc_watch_stalled", IDENTITY) is None
    assert boards[0].registry.get_sample_value("hangdoc_watch_stalled", IDENTITY) == 1
    assert "process_cpu_seconds_total" not in render(boards[1])  # the library's default collectors stay out


# --------------------------------------------------------------------------- HTTP


@pytest.mark.timeout(30)
def test_server_serves_the_registry_and_nothing_else() -> None:
    board = _board()
    server = serve(board, "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            scraped = answer.read().decode()
        assert scraped == render(board)
        board.count("dismissed_total")  # each scrape reads the board as it is then
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            scraped = answer.read().decode()
        assert _one(_samples(scraped), "hangdoc_watch_dismissed_total").value == 1
        # a scraper that asks for OpenMetrics gets it: there, info is an info and _total a counter's
        ask = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(ask, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            om = {f.name: f.type for f in parse_openmetrics(answer.read().decode())}
        assert om["hangdoc_watch"] == "info" and om["hangdoc_watch_reports"] == "counter"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/secrets", timeout=5)
        assert info.value.code == 404
        info.value.close()  # the error holds the answer's connection
        with pytest.raises(UsageError, match="cannot serve metrics"):
            serve(board, "127.0.0.1", port)  # taken
    finally:
        server.shutdown()
        server.server_close()


def _watch(tmp_path: Path, *args: str, job: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SLURM_JOB_ID="31337", SLURM_JOB_NAME="metrics-test", HANGDOC_NO_HELP="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hangdoc",
            "watch",
            "--out",
            str(tmp_path / "hangs"),
            "--metrics-port",
            "0",
            *args,
            "--",
            sys.executable,
            "-c",
            job,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )


def _port(watch: subprocess.Popen[str], lines: list[str]) -> int:
    assert watch.stderr is not None
    for line in watch.stderr:
        lines.append(line)
        found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        if found:
            return int(found[1])
    raise AssertionError(f"no metrics line: {''.join(lines)}")


def _scrape_until(port: int, ready, timeout: float = 60) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    samples: dict[str, list] = {}
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        samples = _samples(text)
        if ready(samples):
            return samples
        time.sleep(0.2)
    raise AssertionError(f"never ready: {samples}")


def _value(samples: dict[str, list], name: str) -> float | None:
    found = samples.get(name)
    return found[0].value if found else None


# a job that prints 6 steps, then goes silent (stuck) until it is ended
STEPS_THEN_SILENCE = (
    "import time\nfor i in range(1, 7):\n    print(f'step {i} loss 0.5', flush=True)\n"
    "    time.sleep(0.05)\ntime.sleep(300)\n"
)


@pytest.mark.timeout(120)
def test_scrape_a_running_watch_through_a_stall(tmp_path: Path) -> None:
    """The real endpoint of a real watch: steps counted, then the silence checked, reported
    (a plain Python process has no rank in its environment: verdict unknown) and counted;
    the textfile holds the same; it is gone once the watch ends."""
    prom = tmp_path / "textfile" / "job.prom"
    prom.parent.mkdir()
    watch = _watch(
        tmp_path,
        "--step-regex",
        r"step (\d+) loss",
        "--stall-after",
        "1.5",
        "--metrics-textfile",
        str(prom),
        job=STEPS_THEN_SILENCE,
    )
    lines: list[str] = []
    try:
        port = _port(watch, lines)
        steps = _scrape_until(port, lambda s: _value(s, "hangdoc_watch_last_step") == 6)
        info = _one(steps, "hangdoc_watch_info")
        assert info.labels == {
            "hostname": HOST,
            "slurm_job_id": "31337",
            "slurm_job": "metrics-test",
            "signal": "step_line",
            "version": __version__,
        }
        assert _value(steps, "hangdoc_watch_steps_seen") == 6
        assert abs(_value(steps, "hangdoc_watch_last_step_timestamp_seconds") - time.time()) < 30
        assert _value(steps, "hangdoc_watch_stall_timeout_seconds") == 1.5
        hung = _scrape_until(port, lambda s: _value(s, "hangdoc_watch_reports_total") == 1)
        assert _value(hung, "hangdoc_watch_stalled") == 1
        assert _value(hung, "hangdoc_watch_suspected_total") == 1
        assert _value(hung, "hangdoc_watch_dismissed_total") == 0
        assert [(s.labels["verdict"], s.value) for s in hung["hangdoc_watch_diagnoses_total"]] == [("unknown", 1)]
        assert _value(hung, "hangdoc_watch_silence_seconds") >= 1.5
        # the textfile catches up within its interval, with the same series
        deadline = time.monotonic() + 10
        while _value(_samples(prom.read_text()), "hangdoc_watch_reports_total") != 1:
            assert time.monotonic() < deadline, prom.read_text()
            time.sleep(0.2)
        on_file = _samples(prom.read_text())
        assert set(on_file) == set(hung)
        assert _one(on_file, "hangdoc_watch_stalled").labels == _one(hung, "hangdoc_watch_stalled").labels
    finally:
        os.killpg(watch.pid, signal.SIGTERM)  # the watch passes it on to the command, then exits
        try:
            watch.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(watch.pid, signal.SIGKILL)
            watch.wait(10)
    assert watch.stderr is not None
    with watch.stderr:
        rest = watch.stderr.read()
    assert "Traceback" not in "".join(lines) + rest
    assert f"metrics written to {prom}" in "".join(lines) + rest
    assert not prom.exists()  # an ended watch's numbers are not left for node_exporter
    assert [p.name for p in prom.parent.iterdir()] == []  # nor a temp file


# ------------------------------------------------------------------------ textfile


@pytest.mark.timeout(30)
def test_textfile_parses_like_the_page_and_is_written_atomically(tmp_path: Path, monkeypatch) -> None:
    board = _board()
    path = tmp_path / "hangdoc.prom"
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def rename(src, dst):  # write_to_textfile's last step: a temp file beside the target, renamed
        renames.append((str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    textfile = Textfile(board, path, say=silent)
    textfile.open()
    assert path.read_text() == render(board)
    assert renames and all(
        dst == str(path) and Path(src).parent == tmp_path and not src.endswith(".prom") for src, dst in renames
    )
    assert {f.name: f.type for f in text_string_to_metric_families(path.read_text())} == FAMILIES
    # readers racing many rewrites always find a whole file
    stop, torn = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            text = path.read_text()
            if not text.endswith("\n") or "hangdoc_watch_diagnoses_total" not in text:
                torn.append(text)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(200):
            board.count("dismissed_total")
            textfile.write(force=True)
    finally:
        stop.set()
        reader.join(10)
    assert torn == []
    assert _one(_samples(path.read_text()), "hangdoc_watch_dismissed_total").value == 200
    textfile.close()
    assert not path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.timeout(30)
def test_textfile_follows_the_board_at_most_once_a_second(tmp_path: Path, monkeypatch) -> None:
    board = MetricsBoard(IDENTITY)
    textfile = Textfile(board, tmp_path / "w.prom", say=silent)
    textfile.open()  # from here, board changes rewrite the file
    writes: list[str] = []
    monkeypatch.setattr(metrics, "write_to_textfile", lambda path, registry: writes.append(path))
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    textfile._written = now[0]
    board.count("suspected_total")
    assert writes == []  # within the interval
    now[0] += metrics.TEXTFILE_INTERVAL
    board.count("reports_total")
    assert writes == [str(tmp_path / "w.prom")]
    textfile.close()
    now[0] += 10
    board.count("reports_total")
    assert len(writes) == 1  # closed: no more writes


def test_textfile_write_failure_is_said_once_and_retried(tmp_path: Path) -> None:
    said = Said()
    board = MetricsBoard()
    path = tmp_path / "gone" / "w.prom"
    (tmp_path / "gone").mkdir()
    textfile = Textfile(board, path, say=said)
    textfile.open()
    path.unlink()
    (tmp_path / "gone").rmdir()
    textfile.write(force=True)
    textfile.write(force=True)
    ((level, line),) = said
    assert level is Level.WARNING and "cannot write the metrics textfile" in line
    (tmp_path / "gone").mkdir()
    textfile.write(force=True)
    assert path.exists() and said[-1] == (Level.INFO, f"metrics textfile {path} written again")
    textfile.close()


def test_textfile_path_forms(tmp_path: Path) -> None:
    assert textfile_path(tmp_path / "a.prom") == tmp_path / "a.prom"
    assert textfile_path(tmp_path) == tmp_path / f"hangdoc_watch_{os.getpid()}.prom"  # node_exporter's directory
    with pytest.raises(UsageError, match=r"must end in \.prom") as info:
        textfile_path(tmp_path / "metrics.txt")
    assert "textfile collector reads only *.prom" in info.value.help
    textfile = Textfile(MetricsBoard(), tmp_path / "missing" / "a.prom", say=silent)
    with pytest.raises(UsageError, match="cannot write it"):
        textfile.open()


@pytest.mark.timeout(60)
def test_cli_refuses_a_bad_textfile_before_starting_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hangdoc",
            "watch",
            "--out",
            str(tmp_path / "hangs"),
            "--metrics-textfile",
            str(tmp_path / "metrics.txt"),
            "--",
            "touch",
            str(marker),
        ],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("hangdoc: error: --metrics-textfile ") and "Traceback" not in done.stderr
    assert not marker.exists()
