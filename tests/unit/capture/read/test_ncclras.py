"""NCCL's RAS report (``hangdoc.capture.read.ncclras``): the parser on the published output and on
the malformed JSON of NCCL 2.28.9, and the client run's skip paths.

Fixtures (``tests/data/gpu/``):

- ``ncclras_doc_sample.json``: the sample output of ``ncclras -f json`` printed in NCCL's
  user guide (NCCL 2.29.1; one communicator of 2 ranks, rank 1 missing, unresponsive),
  copied verbatim from
  https://github.com/NVIDIA/nccl/blob/bbc3d605f44fbbfee9c99688bdfccc2bb7353cf5/docs/userguide/source/troubleshooting/ras.rst
  ("JSON Output").
- ``ncclras_2.28.9_dead_rank.json`` and ``ncclras_2.28.9_lagging_rank.json``: what NCCL
  2.28.9's client prints for two hung 4-rank jobs, written character for character by the
  ``rasOutAppend`` format strings of ``jsonWriteHeader`` ... ``jsonWriteFooter`` in
  https://github.com/NVIDIA/nccl/blob/dbc86fd06e8b0c4517b95d8958a09ccacf9520c9/src/ras/client_support.cc
  (tag v2.28.9-1), with made-up hashes, pids and counts (no NCCL job could be run here).
  The first has a missing rank, so it carries 2.28.9's defect: ``jsonWriteMissingRank``
  prints ``"nvml_dev": %d\\n`` with no comma before ``"status"``; NCCL 2.29.2
  (https://github.com/NVIDIA/nccl/commit/ebd1e929285881cb4df02c3459588a2e12b2d8c0) adds it.
  The second has none, so it is valid JSON.

The client runs use a stand-in ``ncclras`` (a shell script printing a fixture) and a real
process that has mapped a file named ``libnccl.so.2``: no NCCL job can run here.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import TESTS

from hangdoc.capture.read import ncclras
from hangdoc.capture.read.ncclras import (
    RasReportInvalid,
    query_ras,
    ras_report_to_json,
    read_ras_report,
)
from hangdoc.model import RasRank

pytestmark = [pytest.mark.timeout(60)]
DATA = TESTS / "data" / "gpu"
DOC = (DATA / "ncclras_doc_sample.json").read_text()
DEAD = (DATA / "ncclras_2.28.9_dead_rank.json").read_text()
LAGGING = (DATA / "ncclras_2.28.9_lagging_rank.json").read_text()


def test_the_user_guide_sample() -> None:
    report = read_ras_report(DOC, source="ncclras on n1")
    assert report.nccl_version == "2.29.1" and report.source == "ncclras on n1"
    (comm,) = report.communicators
    assert (comm.hash, comm.size) == ("0xae94423cfbb2ef4a", 2)
    present, missing = comm.ranks
    assert present == RasRank(
        comm_rank=0,
        host="172.16.64.245",
        pid=1524344,
        cuda_dev=0,
        nvml_dev=0,
        init_state=0,
        async_error=0,
        collectives=(("Broadcast", 0), ("Reduce", 0), ("AllGather", 0), ("ReduceScatter", 0), ("AllReduce", 0)),
    )
    assert missing == RasRank(
        comm_rank=1,
        host="172.16.64.245",
        pid=1524345,
        cuda_dev=1,
        nvml_dev=1,
        missing=True,
        unresponsive=True,
        dead=False,
    )
    assert comm.missing == (missing,)
    assert (report.timeouts, report.collection_seconds) == (0, 0.0)


def test_nccl_2_28_9_json_is_malformed_and_repaired() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting ',' delimiter"):
        json.loads(DEAD)  # the fixture carries the defect, as 2.28.9 prints it
    report = read_ras_report(DEAD, source="ncclras on n1")
    assert report.source == ("ncclras on n1; malformed NCCL 2.28 JSON repaired: a missing rank's comma after nvml_dev")
    world, pair = report.communicators
    assert world.size == 4 and [r.comm_rank for r in world.ranks] == [0, 1, 2, 3]
    (gone,) = world.missing
    assert (gone.comm_rank, gone.pid, gone.unresponsive, gone.dead) == (3, 40103, True, True)
    assert world.ranks[0].launched == 1534 and dict(world.ranks[0].collectives)["AllReduce"] == 1532
    assert pair.missing == () and pair.size == 2
    assert (report.timeouts, report.collection_seconds) == (2, 2.041)


def test_the_repair_takes_any_whitespace_and_only_that_defect() -> None:
    squeezed = DEAD.replace("\n", "").replace("  ", "")
    assert read_ras_report(squeezed).communicators == read_ras_report(DEAD).communicators
    other = DEAD.replace('"size": 4,', '"size": 4')  # a defect 2.28.9 does not have
    with pytest.raises(RasReportInvalid, match="even with NCCL 2.28's missing commas put back"):
        read_ras_report(other)


def test_valid_2_28_9_output_needs_no_repair() -> None:
    report = read_ras_report(LAGGING)
    assert "repaired" not in report.source
    counts = [dict(r.collectives)["AllReduce"] for r in report.communicators[0].ranks]
    assert counts == [1533, 1533, 1532, 1533]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("NCCL version 2.27.3 compiled with CUDA 12.9", "not JSON"),
        ("[]", "no 'communicators' list"),
        ('{"communicators": [{"ranks": [{"pid": 4}]}]}', r"communicators\[0\].ranks\[0\] has no rank number"),
        ('{"communicators": [{"ranks": [{"rank": -2}]}]}', "not a whole number"),
        ('{"communicators": [{"ranks": [{"rank": true}]}]}', "not a whole number"),
        ('{"communicators": [{"ranks": "all"}]}', "is not a list"),
        ('{"communicators": [{"size": 1e300}]}', "not a whole number"),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_what_is_not_a_report_is_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(RasReportInvalid, match=said) as err:
        read_ras_report(text)
    assert "\n" not in str(err.value)


def test_unknown_pids_and_hosts_are_none_not_minus_one() -> None:
    text = '{"communicators": [{"hash": "0x1", "size": 2, "ranks": [{"rank": 0, "host": "unknown", "pid": -1}]}]}'
    (rank,) = read_ras_report(text).communicators[0].ranks
    assert (rank.host, rank.pid, rank.cuda_dev) == ("", None, None)


@pytest.mark.parametrize("text", [DOC, DEAD, LAGGING])
def test_a_report_crosses_the_wire_as_ras_json(text: str) -> None:
    report = read_ras_report(text, source="ncclras on n1")
    back = read_ras_report(ras_report_to_json(report), source="ncclras via a:7420")
    assert dataclasses.replace(back, source="") == dataclasses.replace(report, source="")
    assert back.source == f"ncclras via a:7420; {report.source}"


# ------------------------------------------------------------------ running the client


@pytest.fixture
def nccl_process(tmp_path: Path) -> Iterator[int]:
    """A real process that has mapped a file named libnccl.so.2, as a NCCL job's ranks do."""
    lib = tmp_path / "lib" / "libnccl.so.2"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 4096)
    code = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A stand-in ``ncclras`` first on PATH, running ``script``; it records its arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    client = bindir / "ncclras"
    client.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n{script}\n')
    client.chmod(client.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return client


def test_a_job_without_nccl_is_not_asked_and_nothing_is_said() -> None:
    query = query_ras([os.getpid()])
    assert query.report is None and query.quiet
    assert query.reason == "the job's processes on this node have not loaded libnccl"


def test_no_client_installed_is_quiet(nccl_process: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncclras, "find_ncclras", lambda: None)
    query = query_ras([nccl_process])
    assert query.report is None and query.quiet and "no ncclras client on PATH" in query.reason


def test_the_client_s_malformed_report_is_read(
    nccl_process: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _client(tmp_path, monkeypatch, f"cat {DATA / 'ncclras_2.28.9_dead_rank.json'}")
    query = query_ras([nccl_process], timeout=3.0, host="n1")
    assert query.report is not None, query.reason
    assert query.report.source.startswith("ncclras on n1; malformed NCCL 2.28 JSON repaired")
    assert (tmp_path / "args").read_text().split() == ["-f", "json", "-t", "3"]


def test_the_ras_address_the_job_set_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"\0" * 4096)
    code = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    env = dict(os.environ, NCCL_RAS_ADDR="127.0.0.1:28100")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        _client(tmp_path, monkeypatch, f"cat {DATA / 'ncclras_doc_sample.json'}")
        assert query_ras([proc.pid], timeout=2.0).report is not None
        assert (tmp_path / "args").read_text().split() == ["-f", "json", "-t", "2", "-h", "127.0.0.1", "-p", "28100"]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_job_that_disabled_ras_is_not_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncclras, "loaded_library", lambda pid, marker: True)
    monkeypatch.setattr(ncclras, "_ras_env", lambda pid: {"NCCL_RAS_ENABLE": "0"})
    client = _client(tmp_path, monkeypatch, "exit 9")
    assert query_ras([os.getpid()]).reason == "the job disabled NCCL's RAS (NCCL_RAS_ENABLE=0)"
    assert client.exists() and not (tmp_path / "args").exists()  # never run


def test_no_ras_service_listening_is_quiet(nccl_process: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what 2.28.9's client prints when nothing listens on the RAS port (client.cc connectToNCCL)
    _client(
        tmp_path,
        monkeypatch,
        "echo 'Connecting to 127.0.0.1:28028: Connection refused' >&2; "
        "echo 'Failed to connect to the NCCL RAS service!' >&2; exit 1",
    )
    query = query_ras([nccl_process])
    assert query.report is None and query.quiet


def test_an_older_nccl_s_refusal_is_said(nccl_process: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NCCL before 2.28.7 answers SET FORMAT with an error (client.cc setOutputFormat)
    _client(tmp_path, monkeypatch, "echo 'Unexpected response from NCCL: ERROR: Unknown command' >&2; exit 1")
    query = query_ras([nccl_process])
    assert not query.quiet
    assert query.reason == "ncclras gave no report: Unexpected response from NCCL: ERROR: Unknown command"


def test_a_client_that_hangs_is_killed_at_its_deadline(
    nccl_process: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ncclras, "_NSENTER_SLACK", 0.5)
    _client(tmp_path, monkeypatch, "exec sleep 30")
    t0 = time.monotonic()
    query = query_ras([nccl_process], timeout=1.0)
    assert time.monotonic() - t0 < 5.0
    assert query.report is None and query.reason == "ncclras did not answer within 2 s"


def test_text_output_is_not_taken_for_a_report(
    nccl_process: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _client(tmp_path, monkeypatch, "echo 'Job summary'; echo '==========='")
    query = query_ras([nccl_process])
    assert query.report is None and query.reason.startswith("ncclras printed no report hangdoc can read: not JSON")


@pytest.mark.parametrize("address", ["203.0.113.7:28028", "ras.example.com:28028", "[2001:db8::1]:28028"])
def test_a_ras_address_off_the_node_is_never_connected_to(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL_RAS_ADDR is the job's word: hangdoc runs the client only for the node's own
    addresses (loopback, or one of the interfaces in the ranks' network namespace)."""
    monkeypatch.setattr(ncclras, "loaded_library", lambda pid, marker: True)
    monkeypatch.setattr(ncclras, "_ras_env", lambda pid: {"NCCL_RAS_ADDR": address})
    client = _client(tmp_path, monkeypatch, f"cat {DATA / 'ncclras_doc_sample.json'}")
    query = query_ras([os.getpid()], timeout=2.0)
    assert query.report is None and "not an address of this node" in query.reason
    assert client.exists() and not (tmp_path / "args").exists()  # never run


def test_the_node_s_own_addresses_are_its_own() -> None:
    me = os.getpid()
    assert ncclras.is_node_address("localhost", me) and ncclras.is_node_address("127.0.0.1", me)
    assert ncclras.is_node_address("::1", me)
    mine = ncclras._local_addresses(me)
    assert ipaddress.ip_address("127.0.0.1") in mine
    assert not ncclras.is_node_address("203.0.113.7", me) and not ncclras.is_node_address("localhost.evil", me)
