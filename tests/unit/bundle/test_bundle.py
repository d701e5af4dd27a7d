"""Snapshot bundles: exact round trips, interning, and one-line errors on bad files.

The malformed-field tests here edit version 1 bundles (records field for field), which
hangdoc still reads; the tables of version 2 have their own in test_bundle_v2.py."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from pathlib import Path

import pytest
from support.factories import make_frame, make_rank, make_snapshot
from support.paths import TESTS

from hangdoc import __version__, bundle
from hangdoc.bundle import (
    BUNDLE_SCHEMA_VERSION,
    load_snapshot,
    save_snapshot,
    snapshot_from_dict,
    snapshot_to_dict,
)
from hangdoc.errors import BundleError
from hangdoc.model import (
    CaptureErrorKind,
    Frame,
    JobSnapshot,
    Note,
    NoteKind,
    RankSource,
    SourceFile,
    ThreadWait,
    Unreachable,
    WaitKind,
)

TRUNK = ["<frozen runpy>:_run_module_as_main:198", "train.py:<module>:60", "train.py:main:55"]
ALL_REDUCE = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]


_WORKERS = Note(
    "not counted as ranks (DataLoader/compile/multiprocessing workers)",
    NoteKind.NOT_RANKS,
    node="node1",
    pids=(4243, 4244),
    listed="pid 4243 (child of rank 1 (pid 4100)), 4244 (child of rank 1 (pid 4100))",
)


def rich_snapshot() -> JobSnapshot:
    """A snapshot using every kind of field the model has."""
    native = make_frame("libc.so.6:pthread_cond_wait", native=True)
    coded = make_frame("train.py:evaluate:48", code="dist.barrier()  # ünïcode ✓")
    ranks = [
        make_rank(0, ALL_REDUCE, threads={"pin_memory": ["threading.py:_bootstrap:995"]}),
        make_rank(1, [*TRUNK, coded, native], host="node1", active=True, cpu_per_sample=0.3),
        make_rank(2, stacks=[ALL_REDUCE, TRUNK, ALL_REDUCE], io_per_sample=4096),
        make_rank(3, ALL_REDUCE, rank_source=RankSource.INFERRED,
                  rank_evidence="spawn index 3 among the launcher's children"),
        make_rank(4, ALL_REDUCE, gone_after=1, world_size=8, env={"MASTER_PORT": "29500"}),
        make_rank(None, (), error=CaptureErrorKind.PTRACE_DENIED, pid=4242),
    ]  # fmt: skip
    return make_snapshot(
        ranks,
        world_size=8,
        unreachable=[Unreachable("node3:50051", "deadline exceeded after 5.0 s", (6, 7))],
        notes=[Note("window extended to 4.0 s"), Note("rank ? (pid 4242): ptrace denied"), _WORKERS],
        sources=[SourceFile("/job/train.py", ((47, "    try:"), (48, "        dist.barrier()")))],
    )


def test_round_trip_is_exact(tmp_path: Path) -> None:
    snap = rich_snapshot()
    save_snapshot(snap, tmp_path / "snap.json")
    back = load_snapshot(tmp_path / "snap.json")
    assert back == snap
    assert back.ranks[5].samples[0].error.kind is CaptureErrorKind.PTRACE_DENIED
    assert back.ranks[3].process.rank_source is RankSource.INFERRED
    assert back.ranks[1].samples[0].threads[0].frames[-1].native is True
    assert back.sources[0].line(48) == "        dist.barrier()"


@pytest.mark.parametrize("version", [1, 2])
def test_dict_round_trip_through_json_text(version: int) -> None:
    snap = rich_snapshot()
    data = json.loads(json.dumps(snapshot_to_dict(snap, schema_version=version)))
    assert data["schema_version"] == version
    assert snapshot_from_dict(data) == snap


def test_envelope_keys() -> None:
    data = snapshot_to_dict(rich_snapshot())
    assert data["kind"] == "hangdoc-snapshot"
    assert data["schema_version"] == BUNDLE_SCHEMA_VERSION == 2
    assert data["hangdoc_version"] == __version__
    assert data["snapshot"]["spec"] == "127.0.0.1:29500"


def test_gzip_when_name_ends_in_gz(tmp_path: Path) -> None:
    snap = rich_snapshot()
    path = tmp_path / "snap.json.gz"
    save_snapshot(snap, path)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(raw))["kind"] == "hangdoc-snapshot"
    assert load_snapshot(path) == snap
    renamed = tmp_path / "snap.bin"  # gzip is recognised by content when reading
    renamed.write_bytes(raw)
    assert load_snapshot(renamed) == snap


def _big(depth: int) -> JobSnapshot:
    stack = [f"train.py:f{i}:{i + 1}" for i in range(depth)] + ALL_REDUCE[-1:]
    return make_snapshot(
        {r: stack for r in range(1000)},
        samples=5,
        threads={"pin_memory": ["threading.py:_bootstrap:995", "threading.py:run:100"]},
    )


def test_identical_stacks_are_stored_once(tmp_path: Path) -> None:
    snap = _big(depth=4)
    data = snapshot_to_dict(snap)
    assert len(data["stacks"]) == 2
    assert len(data["frames"]) == 4 + 1 + 2
    path = tmp_path / "big.json"
    save_snapshot(snap, path)
    back = load_snapshot(path)
    assert back == snap
    stacks = {id(s.threads[0].frames) for r in back.ranks for s in r.samples}
    assert len(stacks) == 1  # decoded ranks share one stack object


def test_bundle_size_does_not_grow_with_stack_depth_per_rank(tmp_path: Path) -> None:
    shallow, deep = tmp_path / "shallow.json", tmp_path / "deep.json"
    save_snapshot(_big(depth=4), shallow)
    save_snapshot(_big(depth=60), deep)
    # 56 more frames cost one table entry each, not 56 x 1000 ranks x 5 samples
    assert deep.stat().st_size - shallow.stat().st_size < 56 * 100
    assert shallow.stat().st_size < 1000 * 2000  # about 1.7 kB per rank for 5 samples x 2 threads


def test_defaults_are_left_out() -> None:
    data = snapshot_to_dict(make_snapshot({0: ALL_REDUCE}), schema_version=1)
    assert data["frames"][0] == {"function": "_run_module_as_main",
                                 "filename": "<frozen runpy>", "line": 198}  # fmt: skip
    thread = data["snapshot"]["ranks"][0]["samples"][0]["threads"][0]
    assert "active" not in thread and thread["frames"] == 0


def test_unknown_keys_are_ignored() -> None:
    data = snapshot_to_dict(make_snapshot({0: ALL_REDUCE}))
    data["snapshot"]["ranks"][0]["gpu"] = {"util": 0}
    data["frames"][0]["column"] = 4
    assert snapshot_from_dict(data) == make_snapshot({0: ALL_REDUCE})


# ------------------------------------------------------------------- bad files


def _good_dict() -> dict:
    """``rich_snapshot()`` as a version 1 bundle, whose paths the tests below edit."""
    return json.loads(json.dumps(snapshot_to_dict(rich_snapshot(), schema_version=1)))


def _write(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    return path


def _error(path: Path) -> str:
    with pytest.raises(BundleError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert info.value.exit_code == 6 and info.value.help
    return message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"hello world", "not valid JSON"),
        (b"\x00\xff\xfe\x80binary", "binary data"),
        (b"[1, 2, 3]", "holds a list, not an object"),
        (b'"just a string"', "holds a string"),
        (b'{"kind": "something-else", "schema_version": 1}', "kind 'something-else'"),
        (b'{"schema_version": 1}', "no 'kind' key"),
        (b'{"kind": "hangdoc-snapshot"}', "schema_version is null"),
        (b'{"kind": "hangdoc-snapshot", "schema_version": "1"}', "schema_version is a string"),
        (b'{"kind": "hangdoc-snapshot", "schema_version": 0}', "unsupported schema_version 0"),
        (b'{"kind": "hangdoc-snapshot", "schema_version": 1}', "at frames: expected a list"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_bad_content(tmp_path: Path, content: bytes, expected: str) -> None:
    path = _write(tmp_path, content)
    message = _error(path)
    assert expected in message
    assert str(path) in message


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(_good_dict())
    message = _error(_write(tmp_path, text[: len(text) // 2].encode()))
    assert "not valid JSON (truncated?)" in message


def test_truncated_gzip(tmp_path: Path) -> None:
    raw = gzip.compress(json.dumps(_good_dict()).encode())
    message = _error(_write(tmp_path, raw[: len(raw) // 2]))
    assert "corrupt or truncated gzip" in message


def test_corrupt_gzip(tmp_path: Path) -> None:
    raw = bytearray(gzip.compress(json.dumps(_good_dict()).encode()))
    raw[20:40] = b"\x00" * 20
    assert "corrupt or truncated gzip" in _error(_write(tmp_path, bytes(raw)))


def test_missing_file(tmp_path: Path) -> None:
    message = _error(tmp_path / "nope.json")
    assert "cannot read snapshot" in message and "No such file" in message


def test_newer_schema_says_upgrade(tmp_path: Path) -> None:
    data = _good_dict()
    data["schema_version"] = BUNDLE_SCHEMA_VERSION + 1
    data["hangdoc_version"] = "9.0.0"
    message = _error(_write(tmp_path, json.dumps(data).encode()))
    assert f"schema_version {BUNDLE_SCHEMA_VERSION + 1}" in message
    assert "hangdoc 9.0.0" in message and "upgrade hangdoc" in message


def _set(path: str, value: object):
    def mutate(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set("snapshot", KeyError), "missing key 'snapshot'"),
        (_set("snapshot.ranks.0.samples.0.threads.0.frames", 99),
         "at snapshot.ranks[0].samples[0].threads[0].frames: stack index 99 out of range"),
        (_set("snapshot.ranks.0.samples.0.threads.0.frames", "0"),
         "stack reference must be an integer, got a string"),
        (_set("stacks.0.1", 10_000), "at stacks[0][1]: frame index 10000 out of range"),
        (_set("snapshot.ranks.5.samples.0.error.kind", "bogus"),
         "at snapshot.ranks[5].samples[0].error.kind: unknown CaptureErrorKind 'bogus'"),
        (_set("snapshot.ranks.3.process.rank_source", "guessed"), "unknown RankSource 'guessed'"),
        (_set("snapshot.ranks.0.process.pid", KeyError),
         "at snapshot.ranks[0].process: missing key 'pid' (RankProcess)"),
        (_set("snapshot.ranks.0.process.pid", "1000"), "process.pid: expected int, got a string"),
        (_set("snapshot.ranks.0.process.pid", True), "expected int, got a boolean"),
        (_set("snapshot.ranks.0.samples.0.t", "soon"), "samples[0].t: expected float"),
        (_set("snapshot.ranks.0.samples", {}), "at snapshot.ranks[0].samples: expected a list"),
        (_set("snapshot.ranks.0", None), "at snapshot.ranks[0]: expected an object"),
        (_set("snapshot.ranks.4.process.env.0", ["MASTER_PORT"]),
         "process.env[0]: expected a list of 2 items, got 1"),
        (_set("frames.0.function", KeyError), "at frames[0]: missing key 'function' (Frame)"),
        (_set("frames.0.line", 1.5), "at frames[0].line: expected int, got the number 1.5"),
        (_set("snapshot.unreachable.0.ranks", [6, "7"]), "unreachable[0].ranks[1]: expected int"),
    ],
)  # fmt: skip
def test_malformed_fields(tmp_path: Path, mutate, expected: str) -> None:
    _mutated_error(tmp_path, mutate, expected)


def _mutated_error(tmp_path: Path, mutate, expected: str) -> str:
    """The one-line error for a good snapshot changed by ``mutate``; it says ``expected``."""
    data = _good_dict()
    mutate(data)
    message = _error(_write(tmp_path, json.dumps(data).encode()))
    assert expected in message, message
    return message


def test_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot write snapshot"):
        save_snapshot(rich_snapshot(), tmp_path / "missing-dir" / "snap.json")


def test_frames_keep_their_values() -> None:
    frame = Frame("f", "/x/y.py", None, native=True, code=None)
    snap = make_snapshot({0: [frame, "train.py:main:3"]})
    assert snapshot_from_dict(snapshot_to_dict(snap)).ranks[0].samples[0].threads[0].frames == (
        frame,
        make_frame("train.py:main:3"),
    )


# --------------------------------------------------- files that are not files, or too big


@pytest.mark.timeout(20)
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a snapshot file" in _error(fifo)


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    assert "/dev/zero is a character device" in _error(Path("/dev/zero"))
    assert "/dev/null is a character device" in _error(Path("/dev/null"))
    assert "is a directory" in _error(tmp_path)


def test_nul_in_the_path(tmp_path: Path) -> None:
    assert "cannot read snapshot" in _error(tmp_path / "a\0b")
    with pytest.raises(BundleError, match="cannot write snapshot"):
        save_snapshot(rich_snapshot(), tmp_path / "a\0b")


def test_plain_file_read_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle.files, "MAX_FILE_BYTES", 1000)
    path = _write(tmp_path, b" " * 1001)
    assert "larger than 1,000 bytes" in _error(path)
    sparse = tmp_path / "sparse.json"
    with sparse.open("wb") as f:
        f.truncate(2**40)  # 1 TiB, refused from its size without reading it
    assert "larger than" in _error(sparse)


def test_gzip_is_inflated_up_to_a_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle.files, "MAX_JSON_BYTES", 2**20)
    bomb = gzip.compress(bytes(64 * 2**20))  # 64 MiB of zeros in 64 kB
    assert "inflates to more than 1 MiB" in _error(_write(tmp_path, bomb))
    # the cap counts all members of a multi-member file together
    member = gzip.compress(b" " * (2**19))
    assert "inflates to more than 1 MiB" in _error(_write(tmp_path, member * 3))


def test_default_caps() -> None:
    assert bundle.MAX_FILE_BYTES == bundle.MAX_JSON_BYTES == 512 * 2**20
    assert bundle.MAX_WORLD_SIZE == 2**20


def test_multi_member_gzip_and_zero_padding_are_read(tmp_path: Path) -> None:
    text = json.dumps(_good_dict()).encode()
    half = len(text) // 2
    raw = gzip.compress(text[:half]) + gzip.compress(text[half:]) + b"\0" * 8
    assert load_snapshot(_write(tmp_path, raw)) == rich_snapshot()


def test_garbage_after_gzip(tmp_path: Path) -> None:
    raw = gzip.compress(json.dumps(_good_dict()).encode()) + b"garbage"
    assert "garbage after the compressed stream" in _error(_write(tmp_path, raw))


# ----------------------------------------------------------------- what JSON it holds


def test_a_json_report_is_named_as_such(tmp_path: Path) -> None:
    from hangdoc.analysis.analyse import analyse
    from hangdoc.report.json_report import error_to_dict, render_json

    snap = rich_snapshot()
    message = _error(_write(tmp_path, render_json(analyse(snap), snap).encode()))
    assert "this is a hangdoc report, not a snapshot; pass the file written by --save" in message
    failed = json.dumps(error_to_dict("JobNotFound", "no ranks", "", 3)).encode()
    assert "this is a hangdoc error report" in _error(_write(tmp_path, failed))


def test_non_utf8_says_where(tmp_path: Path) -> None:
    text = json.dumps(_good_dict()).encode()
    message = _error(_write(tmp_path, text[:100] + b"\xff" + text[100:]))
    assert "binary data, not UTF-8 JSON: byte 0xff at offset 100" in message


def test_huge_integer_literal(tmp_path: Path) -> None:
    text = json.dumps(_good_dict()).replace('"line": 198', '"line": ' + "9" * 5000)
    assert "not valid JSON: Exceeds the limit" in _error(_write(tmp_path, text.encode()))


def test_nan_and_infinity_are_read_into_floats(tmp_path: Path) -> None:
    data = _good_dict()
    data["snapshot"]["window_seconds"] = math.inf
    data["snapshot"]["ranks"][0]["samples"][0]["state"]["cpu_seconds"] = math.nan
    snap = load_snapshot(_write(tmp_path, json.dumps(data).encode()))  # NaN, Infinity tokens
    assert snap.window_seconds == math.inf
    assert math.isnan(snap.ranks[0].samples[0].state.cpu_seconds)


def test_lone_surrogates_round_trip(tmp_path: Path) -> None:
    snap = make_snapshot({0: [make_frame("train.py:f\udcff:3")]}, notes=[Note("bad \ud800 bytes")])
    path = tmp_path / "s.json.gz"
    save_snapshot(snap, path)  # no UnicodeEncodeError
    assert load_snapshot(path) == snap


def test_escape_sequences_load_as_they_are(tmp_path: Path) -> None:
    evil = "\x1b[2J\x1b]0;t\x07\r\u202e\x9b"
    snap = make_snapshot({0: [make_frame(f"train.py:{evil}:3")]}, notes=[Note(evil)])
    save_snapshot(snap, tmp_path / "s.json")
    assert load_snapshot(tmp_path / "s.json") == snap


# ------------------------------------------------------------------------- notes

WORKERS = (
    "not counted as ranks (DataLoader/compile/multiprocessing workers)",
    "pid 4242 (child of rank 56 (pid 4100)), 4243 (child of rank 56 (pid 4100))",
)
NOTES = (
    Note("window extended beyond 2.0 s: straggler is not yet certain"),
    Note(WORKERS[0], NoteKind.NOT_RANKS, node="node7", pids=(4242, 4243), listed=WORKERS[1]),
    Note("evidence still ambiguous after 12.0 s (max window)", NoteKind.WINDOW),
)


@pytest.mark.parametrize("version", [1, 2])
def test_notes_of_words_and_notes_as_values_round_trip(tmp_path: Path, version: int) -> None:
    snap = make_snapshot({0: ALL_REDUCE}, notes=NOTES)
    data = json.loads(json.dumps(snapshot_to_dict(snap, schema_version=version)))
    # a note of words alone is written as its words, as every bundle wrote notes before
    # notes were values; a note that says more is an object, its defaults left out
    assert data["snapshot"]["notes"] == [
        "window extended beyond 2.0 s: straggler is not yet certain",
        {"text": WORKERS[0], "kind": "not_ranks", "node": "node7", "pids": [4242, 4243], "listed": WORKERS[1]},
        {"text": "evidence still ambiguous after 12.0 s (max window)", "kind": "window"},
    ]
    back = snapshot_from_dict(data)
    assert back == snap and back.notes == NOTES
    assert back.notes[1].kind is NoteKind.NOT_RANKS and back.notes[1].pids == (4242, 4243)
    assert back.notes[1].words() == f"node7: {WORKERS[0]}: {WORKERS[1]}"
    save_snapshot(snap, tmp_path / "notes.json.gz")
    assert load_snapshot(tmp_path / "notes.json.gz").notes == NOTES


def test_notes_written_as_words_load_into_note_values(tmp_path: Path) -> None:
    words = [f"node7: {WORKERS[0]}: {WORKERS[1]}", "window extended beyond 2.0 s: straggler is not yet certain"]
    data = snapshot_to_dict(make_snapshot({0: ALL_REDUCE}), schema_version=1)
    data["snapshot"]["notes"] = words  # as hangdoc wrote every note before notes were values
    back = load_snapshot(_write(tmp_path, json.dumps(data).encode()))
    assert back.notes == (Note(words[0]), Note(words[1]))  # their words, nothing read into them
    assert [note.words() for note in back.notes] == words
    recorded = load_snapshot(TESTS / "data" / "bundles_v1" / "straggler_dead_prefetcher_metrics_thread.json.gz")
    assert recorded.notes == (
        Note("window extended beyond 2.0 s: straggler is not yet certain"),
        Note("evidence still ambiguous after 12.0 s (max window)"),
    )


@pytest.mark.parametrize("version", [1, 2])
def test_a_note_kind_of_a_newer_hangdoc_loads_as_other(tmp_path: Path, version: int) -> None:
    snap = make_snapshot({0: ALL_REDUCE}, notes=NOTES[1:2])
    data = json.loads(json.dumps(snapshot_to_dict(snap, schema_version=version)))
    data["snapshot"]["notes"][0]["kind"] = "kind_of_a_later_hangdoc"
    (note,) = load_snapshot(_write(tmp_path, json.dumps(data).encode())).notes
    assert note == dataclasses.replace(NOTES[1], kind=NoteKind.OTHER)  # only grouping reads a kind
    data["snapshot"]["notes"][0]["kind"] = 7
    assert "notes[0].kind" in _error(_write(tmp_path, json.dumps(data).encode()))


@pytest.mark.parametrize("version", [1, 2])
def test_a_note_pid_out_of_range_is_refused(tmp_path: Path, version: int) -> None:
    snap = make_snapshot({0: ALL_REDUCE}, notes=NOTES[1:2])
    data = json.loads(json.dumps(snapshot_to_dict(snap, schema_version=version)))
    data["snapshot"]["notes"][0]["pids"][0] = 2**30
    message = _error(_write(tmp_path, json.dumps(data).encode()))
    assert "at snapshot.notes[0].pids[0]: 1073741824 is out of range (0 to 4194304)" in message
    data["snapshot"]["notes"][0]["pids"] = [2**22, 0]  # the bounds themselves are pids
    assert load_snapshot(_write(tmp_path, json.dumps(data).encode())).notes[0].pids == (2**22, 0)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set("snapshot.world_size", 2_000_000_000),
         "at snapshot.world_size: 2000000000 is out of range (0 to 1048576)"),
        (_set("snapshot.world_size", 1e300), "at snapshot.world_size: expected int, got the number"),
        (_set("snapshot.world_size", -8), "-8 is out of range"),
        (_set("snapshot.world_size", True), "at snapshot.world_size: expected int, got a boolean"),
        (_set("snapshot.world_size", 2**20 + 1), "1048577 is out of range"),
        (_set("snapshot.ranks.0.process.world_size", 10**12), "process.world_size: 1000000000000"),
        (_set("snapshot.ranks.0.process.rank", 2**20), "process.rank: 1048576 is out of range"),
        (_set("snapshot.ranks.0.process.rank", -1), "process.rank: -1 is out of range"),
        (_set("snapshot.ranks.0.process.local_rank", -1), "process.local_rank: -1 is out"),
        (_set("snapshot.ranks.0.process.pid", 2**22 + 1), "process.pid: 4194305 is out of range"),
        (_set("snapshot.ranks.0.process.launcher_pid", -5), "process.launcher_pid: -5 is out"),
        (_set("snapshot.unreachable.0.ranks", [6, 2**40]),
         "at snapshot.unreachable[0].ranks[1]: 1099511627776 is out of range"),
        (_set("frames.0.line", -3), "at frames[0].line: -3 is out of range"),
        (_set("snapshot.ranks.0.samples.0.threads.0.thread_id", 2**64),
         "thread_id: integer 18446744073709551616 does not fit in 64 bits"),
        (_set("snapshot.ranks.0.samples.0.t", 10**400), "samples[0].t: the number 1000"),
        (_set("snapshot.ranks.0.samples.0.t", 10**400), "is too large"),
        (_set("snapshot.ranks.5.samples.0.error.kind", ["list"]), "unknown CaptureErrorKind ['list']"),
        (_set("snapshot.ranks.5.samples.0.error.kind", "k" * 10_000), "(10000 characters)"),
        (_set("kind", "\x1b[2J" * 100), "kind '\\x1b[2J"),
    ],
)  # fmt: skip
def test_out_of_range_and_odd_values(tmp_path: Path, mutate, expected: str) -> None:
    message = _mutated_error(tmp_path, mutate, expected)
    assert len(message) < 1000 and "\x1b" not in message


def test_bounds_are_inclusive(tmp_path: Path) -> None:
    data = _good_dict()
    data["snapshot"]["world_size"] = 2**20
    data["snapshot"]["ranks"][0]["process"]["pid"] = 2**22
    data["snapshot"]["ranks"][0]["samples"][0]["threads"][0]["thread_id"] = 2**64 - 1
    snap = load_snapshot(_write(tmp_path, json.dumps(data).encode()))
    assert snap.world_size == 2**20 and snap.ranks[0].process.pid == 2**22


def test_deep_shared_stacks_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interning lets a small file give many threads one deep stack; the analysis walks
    each thread's frames, so the frames of all threads together are capped."""
    data = _good_dict()
    data["stacks"][0] = [0] * (bundle.MAX_STACK_DEPTH + 1)
    assert "at stacks[0]: a stack of 100,001 frames" in _error(_write(tmp_path, json.dumps(data).encode()))
    monkeypatch.setattr(bundle.tables, "MAX_THREAD_FRAMES", 50)
    message = _error(_write(tmp_path, json.dumps(_good_dict()).encode()))
    assert "hold more than 50 frames in all" in message


@pytest.mark.parametrize("version", [1, 2])
def test_waits_and_the_processes_beyond_the_ranks_round_trip(tmp_path: Path, version: int) -> None:
    waits = (
        ThreadWait(1000, "recvfrom", WaitKind.SOCKET, 5, "socket:[77]", (812,)),
        ThreadWait(1100, "futex", WaitKind.THREAD),
    )
    rank = make_snapshot({0: ALL_REDUCE}).ranks[0]
    rank = dataclasses.replace(rank, samples=(*rank.samples[:-1], dataclasses.replace(rank.samples[-1], waits=waits)))
    server = make_snapshot({0: ALL_REDUCE}, pid=812).ranks[0]
    server = dataclasses.replace(server, process=dataclasses.replace(server.process, rank=None, rank_source=None))
    snap = dataclasses.replace(make_snapshot([rank]), beyond=(server,))
    data = json.loads(json.dumps(snapshot_to_dict(snap, schema_version=version)))
    assert snapshot_from_dict(data) == snap
    save_snapshot(snap, tmp_path / "beyond.json.gz")
    back = load_snapshot(tmp_path / "beyond.json.gz")
    assert back == snap and back.ranks[0].samples[-1].waits == waits and back.beyond[0].process.pid == 812
