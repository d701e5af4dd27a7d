"""What a probe's answer may cost its reader (issue 23, items 2 and 3): its text is bounded,
its JSON is parsed within a budget that stops at the first value past it, and a probe that
drips its answer is dropped in seconds. The hostile probes are real processes
(``tests/support/fake_probe.py``) read by the real client."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fake_probe import answer as fake_answer
from support.paths import TESTS

from hangdoc import probe
from hangdoc.capture.read import probe_client
from hangdoc.capture.read.boundedjson import (
    JsonTooBig,
    JsonTooDeep,
    ascii_json,
    check_counts,
    loads_small,
)
from hangdoc.capture.read.probe_client import MAX_ANSWER_BYTES, PEAK_ANSWER_BYTES, probe_state
from hangdoc.model import ProbeStatus

pytestmark = pytest.mark.timeout(60)
FAKE = TESTS / "support" / "fake_probe.py"


# ------------------------------------------------------------------ the budgeted parsers


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "[]",
        '"x"',
        "0",
        "-0.5e3",
        "true",
        "null",
        "[NaN, Infinity, -Infinity]",
        ' { "a" : [ 1 , 2 ] } ',
        '{"a": [1, 2.5, -3e2, true, false, null, "x\\u00e9\\ud83d\\ude00\\n"], "b": {"c": {}}, "a": 2}',
    ],
)
def test_the_small_reader_reads_what_json_reads(text: str) -> None:
    assert json.dumps(loads_small(text, 100)) == json.dumps(json.loads(text))


@pytest.mark.parametrize(
    "text", ["", "{", "[1,]", '{"a" 1}', '{"a": 1,}', "01", "[1 2]", '"abc', "tru", "{1: 2}", "[1]x", '"a\x01"']
)
def test_the_small_reader_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError, match="not valid JSON"):
        loads_small(text, 100)


def test_the_small_reader_stops_at_the_first_value_past_its_budget() -> None:
    assert loads_small('{"a": [1, 2]}', 5) == {"a": [1, 2]}  # the object, a key, the list, two numbers
    for text, said in (
        ('{"a": [1, 2]}', "more than 3 values"),
        ("[" * 17 + "]" * 17, "nested more than 16 deep"),
        ("1" * 65, "a number of 65 characters"),
    ):
        with pytest.raises(JsonTooBig, match=said):
            loads_small(text, 3 if text.startswith("{") else 100)
    long = '{"dump": "' + "x" * 1_000_000 + '"}'  # one long string is one value
    assert len(loads_small(long, 3)["dump"]) == 1_000_000  # type: ignore[index]  # object, key, string


def test_the_count_before_json_builds_the_dump() -> None:
    check_counts(b'{"entries": [' + b"{}," * 99 + b"{}]}", 103)  # 101 dicts, one list, one string
    for raw in (
        b'{"entries": [' + b"{}," * 100 + b"{}]}",
        b"[" + b"1000," * 200 + b"1]",
        b"[" + b"[]," * 200 + b"[]]",
        b"[" + b'"ab",' * 200 + b'"ab"]',
        b"[" + b"NaN," * 200 + b"NaN]",
    ):
        with pytest.raises(JsonTooBig):
            check_counts(raw, 103)
    with pytest.raises(JsonTooDeep, match="nested too deeply"):
        check_counts(b"[" * 100_000 + b"]" * 100_000, 10**6)


def test_a_dump_becomes_ascii_and_reads_back_the_same() -> None:
    text = '{"name": "g\u00e9 \u4e00 \U0001f600", "n": 1}'
    assert ascii_json(text).isascii() and json.loads(ascii_json(text)) == json.loads(text)


# ------------------------------------------------------------------ hostile probes, read by the real client


@pytest.fixture
def private_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix=f"hangdoc-probe-{os.geteuid()}-")
    try:
        yield directory
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _fake(directory: str, answer: str, size: int = 1000, drip: float = 0.0) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--dir", directory, "--answer", answer, "--size", str(size), "--drip", str(drip)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    return proc


def test_a_probe_that_drips_its_answer_is_dropped_within_seconds(private_dir: str) -> None:
    proc = _fake(private_dir, "quiet", drip=0.5)
    try:
        started = time.monotonic()
        answer = probe_state(proc.pid, timeout=30.0)  # a long deadline: the rate drops it first
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert answer.status is ProbeStatus.FAILED and took < 4
    # a byte every 0.5 s: 4 or 5 of them in the 2 s before the rate drops it, as the machine allows
    assert re.match(r"its probe sent [3-5] bytes of its answer in 2\.\d s, slower than hangdoc reads", answer.reason)
    assert answer.reason.endswith("(a gap of 2 s at most, 4 MiB/s at least): dropped")


def test_an_answer_past_the_cap_is_refused_unread(private_dir: str) -> None:
    proc = _fake(private_dir, "entries", size=MAX_ANSWER_BYTES)
    try:
        answer = probe_state(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    size = len(fake_answer("entries", MAX_ANSWER_BYTES))
    assert answer.status is ProbeStatus.FAILED
    assert answer.reason == (
        f"its probe sent an answer hangdoc cannot read: an answer of {size:,} bytes, more than {MAX_ANSWER_BYTES:,}"
    )


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (
            "entries",
            (
                "its probe sent a flight recorder dump hangdoc cannot read: JSON of more than 524,288 objects, lists, "
                "strings and numbers (a ring of more than ~11,155 entries: a smaller TORCH_FR_BUFFER_SIZE fits)"
            ),
        ),
        ("dump-lists", "its probe sent a flight recorder dump hangdoc cannot read: JSON of 2,"),
        ("exceptions", "its probe sent an answer hangdoc cannot read: more than 4,096 values"),
        ("strings", "its probe sent an answer hangdoc cannot read: more than 4,096 values"),
    ],
)
def test_an_answer_of_countless_values_is_refused_within_its_memory_bound(
    private_dir: str, kind: str, said: str
) -> None:
    proc = _fake(private_dir, kind, size=MAX_ANSWER_BYTES - 1000)
    try:
        tracemalloc.start()
        answer = probe_state(proc.pid, timeout=30.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert answer.reason.startswith(said) and answer.flight is None
    assert peak < 3 * MAX_ANSWER_BYTES < PEAK_ANSWER_BYTES  # the text, once as bytes and once as text


def test_the_probe_leaves_out_a_dump_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "MAX_ANSWER_BYTES", 1000)
    for answer, keys in (
        ({"ok": True, "flight": {"dump": "x" * 2000}, "exceptions": []}, {"ok", "flight", "exceptions"}),
        ({"ok": True, "dump": "x" * 2000}, {"ok", "error"}),
    ):
        left, right = socket.socketpair()
        with left, right:
            probe._send(left, answer)
            left.close()
            data = b""
            while chunk := right.recv(65536):
                data += chunk
        told = json.loads(data[probe.LENGTH.size :])
        assert set(told) == keys and len(data) < 1000
        error = told["flight"]["error"] if "flight" in told else told["error"]
        assert error.startswith("the flight recorder dump makes an answer of 2,0") and "(1,000)" in error


def test_the_bounds_are_what_the_agent_can_multiply() -> None:
    assert probe_client.MAX_ANSWER_BYTES == probe.MAX_ANSWER_BYTES == 8 * 2**20
    assert PEAK_ANSWER_BYTES == 8 * MAX_ANSWER_BYTES
    assert Path(FAKE).is_file()
