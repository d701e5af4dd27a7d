"""Snapshot bundles: exact round trips, interning, and one-line errors on bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from factories import make_frame, make_rank, make_snapshot

from hangdoc import SCHEMA_VERSION, __version__
from hangdoc.bundle import load_snapshot, save_snapshot, snapshot_from_dict, snapshot_to_dict
from hangdoc.errors import BundleError
from hangdoc.model import (
    CaptureErrorKind,
    Frame,
    JobSnapshot,
    RankSource,
    SourceFile,
    Unreachable,
)

TRUNK = ["<frozen runpy>:_run_module_as_main:198", "train.py:<module>:60", "train.py:main:55"]
ALL_REDUCE = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]


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
        notes=["window extended to 4.0 s", "rank ? (pid 4242): ptrace denied"],
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


def test_dict_round_trip_through_json_text() -> None:
    snap = rich_snapshot()
    data = json.loads(json.dumps(snapshot_to_dict(snap)))
    assert snapshot_from_dict(data) == snap


def test_envelope_keys() -> None:
    data = snapshot_to_dict(rich_snapshot())
    assert data["kind"] == "hangdoc-snapshot"
    assert data["schema_version"] == SCHEMA_VERSION
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
    data = snapshot_to_dict(make_snapshot({0: ALL_REDUCE}))
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
    return json.loads(json.dumps(snapshot_to_dict(rich_snapshot())))


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
    data["schema_version"] = SCHEMA_VERSION + 1
    data["hangdoc_version"] = "9.0.0"
    message = _error(_write(tmp_path, json.dumps(data).encode()))
    assert f"schema_version {SCHEMA_VERSION + 1}" in message
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
    data = _good_dict()
    mutate(data)
    message = _error(_write(tmp_path, json.dumps(data).encode()))
    assert expected in message, message


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
