"""``hangdoc analyze DIR`` of flight recorder dumps someone else may have written (issue 23,
item 7): every attack is a real file in ``tmp_path``, refused in one line or bounded, never a
traceback, a crash or a hang, and nothing is read through a link."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import TESTS

from hangdoc.capture.dumps import flight_files
from hangdoc.capture.dumps.flight_files import FlightDirError, read_flight_dir
from hangdoc.capture.read.flight_recorder import FlightRecordInvalid, read_flight_record
from hangdoc.model import Note

REPO = TESTS.parent
GOOD = TESTS / "data" / "flight" / "op_mismatch"  # three real dumps, ranks 0-2
PICKLED = TESTS / "data" / "flight" / "size_mismatch"  # torch's own pickle


def _text(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def billion_laughs(levels: int = 40, where: str = "version") -> bytes:
    """``{"entries": [], where: L40}`` where ``L(k+1) = [Lk, Lk]`` through the memo."""
    out = bytearray(b"\x80\x04}\x94")  # {} memo 0
    out += _text("entries") + b"\x94]\x94"  # "entries" memo 1, [] memo 2
    out += b"s"  # top["entries"] = []
    out += _text(where) + b"\x94"  # memo 3
    out += _text("lol") + b"\x94"  # L0 = "lol", memo 4
    for level in range(levels):
        out += b"0"  # POP the previous level off the stack (it stays in the memo)
        out += b"]\x94(" + b"h" + bytes([4 + level]) + b"h" + bytes([4 + level]) + b"e"
    out += b"s."  # top[where] = L(levels)
    return bytes(out)


def deep(depth: int = 200_000) -> bytes:
    """``{"entries": [{"process_group": [[[...]]]}]}``, nested ``depth`` lists deep."""
    return (
        b"\x80\x04}" + _text("entries") + b"]}" + _text("process_group") + b"]" * depth + b"a" * (depth - 1) + b"sas."
    )


def deep_tuple_key(depth: int = 1_000_000) -> bytes:
    """A dict key nested a million tuples deep: hashing it overflows the C stack."""
    return b"\x80\x04}" + _text("entries") + b"]s" + b")" + b"\x85" * depth + b"K\x01s."


def shared_tuple_key(levels: int = 40) -> bytes:
    """A dict key that is one tuple shared 2^40 times: hashing it never ends."""
    out = bytearray(b"\x80\x04}" + _text("entries") + b"]s" + b")\x94")
    for level in range(levels):
        out += b"0h" + bytes([level]) + b"h" + bytes([level]) + b"\x86\x94"
    return bytes(out) + b"K\x01s."


def entry(seq: int, **fields: object) -> dict[str, object]:
    return {
        "record_id": seq,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": "nccl:all_reduce",
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "output_dtypes": ["Float"],
        "is_p2p": False,
        "state": "completed",
        "retired": True,
        **fields,
    }


def dump(*entries: dict[str, object], **top: object) -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": list(entries),
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
        **top,
    }


def refused(raw: bytes, needle: str) -> str:
    with pytest.raises(FlightRecordInvalid, match=needle) as caught:
        read_flight_record(raw)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300
    return str(caught.value)


def good_dir(tmp_path: Path) -> Path:
    out = tmp_path / "dumps"
    out.mkdir()
    for rank in range(3):
        shutil.copy(GOOD / f"fr_trace_{rank}.json", out / f"nccl_trace_rank_{rank}")
    return out


def not_read(snapshot) -> str:
    return next(n.words() for n in snapshot.notes if n.words().startswith("not read as dumps"))


# ------------------------------------------------------------------ one dump


def test_billion_laughs_is_a_few_hundred_bytes_and_refused_unread() -> None:
    raw = billion_laughs()
    assert len(raw) < 500 and sum(op.name == "BINGET" for op, _, _ in pickletools.genops(raw)) == 80
    refused(raw, "'version' is a list, where a dump holds a string")
    # where hangdoc reads nothing (or no scalar), the shared list costs what its bytes cost
    assert read_flight_record(billion_laughs(where="pg_config")).groups == ()
    assert read_flight_record(billion_laughs(where="pg_status")).entries == ()


@pytest.mark.parametrize(
    "field", ["process_group", "profiling_name", "state", "input_sizes", "input_dtypes", "collective_seq_id", "is_p2p"]
)
def test_billion_laughs_in_any_field_of_an_entry(field: str) -> None:
    shared: list[object] = ["lol"]
    for _ in range(40):
        shared = [shared, shared]
    raw = pickle.dumps(dump(entry(1, **{field: shared})), protocol=2)  # torch's protocol
    assert len(raw) < 1_000
    refused(raw, "entry 0: ")


def test_deep_nesting_is_refused_without_recursion() -> None:
    refused(deep(), "entry 0: 'process_group' is a list, where a dump holds a string")
    refused(b'{"entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply")
    nested = json.dumps(entry(1)).replace('"default_pg"', "[" * 50_000 + "1" + "]" * 50_000)
    refused(f'{{"entries": [{nested}]}}'.encode(), "nested too deeply")


def test_dict_keys_are_scalars_so_loading_never_hashes_a_container() -> None:
    refused(deep_tuple_key(), "a dict key is a tuple")  # pickle.loads: a segmentation fault
    refused(shared_tuple_key(), "a dict key is a tuple")  # pickle.loads: never returns


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        # find_class used to allow builtins: bytes(10**10) would fill 10 GB as it loaded
        (
            b"\x80\x04}" + _text("entries") + b"\x8c\x08builtins\x8c\x05bytes\x93\x8a\x05\x00\xe4\x0bT\x02\x85R.",
            "the pickle names builtins.bytes: a dump holds plain data only",
        ),
        (pickle.dumps({"entries": [], "x": {1, 2}}), "EMPTY_SET"),
        (pickle.dumps({"entries": [], "x": b"raw"}), "SHORT_BINBYTES"),
        (pickle.dumps({"entries": [], "x": 2**4000}), "an integer of 501 bytes"),
        (pickle.dumps(dump(entry(1)))[:-20], "a broken pickle"),
        (pickle.dumps(dump(entry(1)), protocol=0), "neither JSON nor a pickle"),
        (pickle.dumps(dump(entry(1)), protocol=2).replace(b"\x88", b"I01\n", 1), "the pickle uses INT at byte"),
    ],
)
def test_a_pickle_builds_plain_data_only(raw: bytes, needle: str) -> None:
    refused(raw, needle)


def test_torch_pickles_of_every_protocol_read_like_json() -> None:
    data = dump(entry(1), entry(2, profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=1))
    expected = read_flight_record(json.dumps(data).encode())
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert read_flight_record(pickle.dumps(data, protocol=protocol)) == expected
    real = read_flight_record((PICKLED / "nccl_trace_rank_2").read_bytes())
    assert real.entries and real.groups


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"state": {"a": ["b"]}}, "entry 0: 'state' is a dict, where a dump holds a string"),
        ({"profiling_name": ["nccl:all_reduce"]}, "'profiling_name' is a list"),
        ({"process_group": [["0"], "default_pg"]}, "'process_group' is a list"),
        ({"input_dtypes": [{"Float": 1}]}, "a dtype is a dict"),
        ({"retired": "yes"}, "'retired' is a str, where a dump holds true or false"),
        ({"input_sizes": [[{"4": 4}]]}, "expected an integer, got a dict"),
        ({"collective_seq_id": "9" * 5000}, "a number of 5,000 digits is out of range"),
    ],
)
def test_only_scalars_where_scalars_belong(fields: dict[str, object], needle: str) -> None:
    refused(json.dumps(dump(entry(1, **fields))).encode(), needle)


def test_scalars_of_the_header_and_groups() -> None:
    refused(json.dumps(dump(entry(1), version=["2.10"])).encode(), "'version' is a list")
    groups = {"0": {"name": {"x": 1}, "desc": "", "ranks": "[0]"}}
    refused(json.dumps(dump(entry(1), pg_config=groups)).encode(), "a group's 'name' is a dict")
    ranks = {"0": {"name": "0", "desc": "", "ranks": "[" * 100_000}}
    assert read_flight_record(json.dumps(dump(entry(1), pg_config=ranks)).encode()).groups[0].ranks == ()


def test_json_of_too_many_objects_is_refused_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    from hangdoc.capture.read import flight_recorder

    monkeypatch.setattr(flight_recorder, "MAX_OBJECTS", 1_000)
    refused(b'{"entries": [' + b"{}," * 2_000 + b"{}]}", "JSON of 2,004 objects: more than 1,000")


# ------------------------------------------------------------------ a directory


def test_symlinks_are_never_followed_and_hard_links_read_once(tmp_path: Path) -> None:
    out = good_dir(tmp_path)
    for rank in range(3, 103):  # 100 links to one dump
        (out / f"nccl_trace_rank_{rank}").symlink_to(out / "nccl_trace_rank_0")
    os.link(out / "nccl_trace_rank_1", out / "nccl_trace_rank_200")
    (out / "nccl_trace_rank_300").symlink_to("/etc/passwd")
    snap = read_flight_dir(out)
    assert [r.rank for r in snap.ranks] == [0, 1, 2]
    note = not_read(snap)
    assert "nccl_trace_rank_10 (a symbolic link, not followed)" in note and note.endswith("and 94 more")


def test_a_hard_link_is_named_as_the_same_file(tmp_path: Path) -> None:
    out = good_dir(tmp_path)
    os.link(out / "nccl_trace_rank_1", out / "nccl_trace_rank_7")
    snap = read_flight_dir(out)
    assert [r.rank for r in snap.ranks] == [0, 1, 2]
    assert "nccl_trace_rank_7 (the same file as nccl_trace_rank_1)" in not_read(snap)


def _swap_after_listing(monkeypatch: pytest.MonkeyPatch, swap) -> None:
    real = flight_files._list

    def listed_then_swapped(path: Path, dir_fd: int):
        names = real(path, dir_fd)
        swap()
        return names

    monkeypatch.setattr(flight_files, "_list", listed_then_swapped)


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_at_once_even_when_swapped_in_after_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = good_dir(tmp_path)
    os.mkfifo(out / "nccl_trace_rank_5")  # there when listed
    victim = out / "nccl_trace_rank_2"

    def swap() -> None:
        victim.unlink()
        os.mkfifo(victim)  # torch's default prefix is /tmp/nccl_trace_rank_: anyone can do this

    _swap_after_listing(monkeypatch, swap)
    snap = read_flight_dir(out)
    assert [r.rank for r in snap.ranks] == [0, 1]
    assert not_read(snap) == (
        "not read as dumps: nccl_trace_rank_2 (a FIFO (named pipe), not a regular file), "
        "nccl_trace_rank_5 (a FIFO (named pipe), not a regular file)"
    )


def test_a_symlink_swapped_in_after_listing_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = good_dir(tmp_path)
    victim = out / "nccl_trace_rank_2"

    def swap() -> None:
        victim.unlink()
        victim.symlink_to(out / "nccl_trace_rank_0")

    _swap_after_listing(monkeypatch, swap)
    snap = read_flight_dir(out)
    assert [r.rank for r in snap.ranks] == [0, 1]
    assert "nccl_trace_rank_2 (a symbolic link, not followed)" in not_read(snap)


def test_other_files_are_refused_and_named_in_one_line(tmp_path: Path) -> None:
    out = good_dir(tmp_path)
    (out / "nccl_trace_rank_4").mkdir()
    with open(out / "nccl_trace_rank_5", "wb") as big:  # sparse: refused by its size, unread
        big.truncate(flight_files.MAX_FILE_BYTES + 1)
    (out / "forged\nline_6").write_bytes(billion_laughs())
    snap = read_flight_dir(out)
    assert [r.rank for r in snap.ranks] == [0, 1, 2]
    note = not_read(snap)
    assert "\n" not in note
    assert "nccl_trace_rank_4 (a directory, not a regular file)" in note
    assert "nccl_trace_rank_5 (larger than 16 MiB, more than any flight recorder dump)" in note
    assert "forged\\nline_6 ('version' is a list, where a dump holds a string)" in note


def test_entries_are_capped_over_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight_files, "MAX_DIR_ENTRIES", 12)
    out = tmp_path / "dumps"
    out.mkdir()
    for rank in range(3):
        (out / f"fr_{rank}.json").write_text(json.dumps(dump(*(entry(i) for i in range(1, 11)))))
    snap = read_flight_dir(out)
    assert [len(r.flight.entries) for r in snap.ranks if r.flight] == [4, 4, 4]
    assert [e.seq for e in snap.ranks[0].flight.entries] == [7, 8, 9, 10]  # the newest
    assert Note("3 dumps: the newest 4 entries of each were kept") in snap.notes


def test_bytes_are_capped_over_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight_files, "MAX_DIR_BYTES", 5_000)
    snap = read_flight_dir(good_dir(tmp_path))
    assert [r.rank for r in snap.ranks] == [0, 1]
    assert Note("1 file not read: 0 MiB read already") in snap.notes


def test_a_directory_of_attacks_only_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(billion_laughs())
    (tmp_path / "nccl_trace_rank_1").symlink_to("/etc/passwd")
    with pytest.raises(FlightDirError, match="no flight recorder dump in it") as caught:
        read_flight_dir(tmp_path)
    assert "\n" not in str(caught.value)
    assert "nccl_trace_rank_1 (a symbolic link, not followed)" in str(caught.value)


# ------------------------------------------------------------------ the real CLI

_MEASURED = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
print(f"\\nexit {done.returncode} peak_kb {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")
"""


def _analyze(path: Path) -> tuple[int, str, str, int]:
    """``hangdoc analyze path`` as a child of a fresh process that reports the child's peak RSS."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, sys.executable, "-m", "hangdoc", "analyze", str(path), "--width", "200"],
        check=True,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
    )
    *out, last = done.stdout.rstrip("\n").split("\n")
    _, code, _, peak_kb = last.split()
    return int(code), "\n".join(out), done.stderr, int(peak_kb)


@pytest.mark.timeout(120)
def test_cli_on_a_directory_of_attacks_is_a_partial_result_in_bounded_memory(tmp_path: Path) -> None:
    out = good_dir(tmp_path)
    (out / "nccl_trace_rank_10").write_bytes(billion_laughs())
    (out / "nccl_trace_rank_11").write_bytes(deep())
    (out / "nccl_trace_rank_12").write_bytes(deep_tuple_key())
    (out / "nccl_trace_rank_13").write_bytes(shared_tuple_key())
    (out / "nccl_trace_rank_14").write_text(json.dumps(dump(entry(1, state={"a": [1]}))))
    os.mkfifo(out / "nccl_trace_rank_15")
    for rank in range(100, 200):
        (out / f"nccl_trace_rank_{rank}").symlink_to(out / "nccl_trace_rank_0")
    code, stdout, stderr, peak_kb = _analyze(out)
    assert (code, stderr) == (0, "")
    assert "collective mismatch (flight recorder): rank 0 called broadcast" in stdout  # the real dumps
    assert "not read as dumps: nccl_trace_rank_10 ('version' is a list" in stdout
    print(f"peak RSS of hangdoc analyze: {peak_kb / 1024:.0f} MiB")
    assert peak_kb < 400 * 1024, f"peak RSS {peak_kb} kB"


@pytest.mark.timeout(120)
def test_cli_on_a_directory_without_a_readable_dump_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(billion_laughs())
    (tmp_path / "nccl_trace_rank_1").write_bytes(deep_tuple_key())
    os.mkfifo(tmp_path / "nccl_trace_rank_2")
    code, stdout, stderr, peak_kb = _analyze(tmp_path)
    first, *rest = stderr.splitlines()
    assert code == 6 and "Traceback" not in stderr and not stdout
    assert first.startswith(f"hangdoc: error: {tmp_path}: no flight recorder dump in it (not read: ")
    assert "nccl_trace_rank_2 (a FIFO (named pipe), not a regular file)" in first
    assert [line.split(":")[0].strip() for line in rest] == ["help"]
    print(f"peak RSS of hangdoc analyze: {peak_kb / 1024:.0f} MiB")
    assert peak_kb < 400 * 1024, f"peak RSS {peak_kb} kB"
