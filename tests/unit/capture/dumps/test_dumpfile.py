"""``hangdoc analyze FILE`` on the stack dumps users already have (``capture.dumps.dumpfile``).

The dumps in ``tests/data/dumps/`` are real: ``record.py`` there ran py-spy on real hung
jobs of the corpus (``tests/jobs/``), as a user would by hand, and each must get the
verdict and culprits its job's header states. ``public/`` holds dumps posted in public
issues, with their source in a header comment.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import save_snapshot
from hangdoc.capture.dumps import dumpfile
from hangdoc.capture.dumps.dumpfile import DumpFormat, load_evidence, sniff
from hangdoc.cli import main
from hangdoc.errors import BundleError, DumpFileError
from hangdoc.model import CaptureErrorKind, RankSource, RankState, Verdict

DUMPS = TESTS / "data" / "dumps"
JOBS = TESTS / "jobs"


def expected(job: str) -> tuple[str, list[int]]:
    """The verdict and culprits a corpus job's header states."""
    header = (JOBS / f"{job}.py").read_text().splitlines()[0]
    m = re.fullmatch(r"# hangdoc-expect: verdict=(\w+) culprits=([\d,]+|none)", header)
    assert m, header
    return m[1], [] if m[2] == "none" else [int(c) for c in m[2].split(",")]


RECORDED = [
    # (fixture, the corpus job it was recorded from, its format)
    ("mismatch_wrapper_two_callers.txt", "mismatch_wrapper_two_callers", DumpFormat.PYSPY_TEXT),
    ("mismatch_wrapper_two_callers_locals.txt", "mismatch_wrapper_two_callers", DumpFormat.PYSPY_TEXT),
    ("mismatch_wrapper_two_callers_list.json", "mismatch_wrapper_two_callers", DumpFormat.PYSPY_JSON),
    ("straggler_forked_worker_lock_native.txt", "straggler_forked_worker_lock", DumpFormat.PYSPY_TEXT),
    ("straggler_forked_worker_lock_all_processes.txt", "straggler_forked_worker_lock", DumpFormat.PYSPY_TEXT),
    (
        "mismatch_pipeline_short_last_batch_p2p_labelled.txt",
        "mismatch_pipeline_short_last_batch_p2p",
        DumpFormat.PYSPY_TEXT,
    ),
    ("mismatch_pipeline_short_last_batch_p2p.json", "mismatch_pipeline_short_last_batch_p2p", DumpFormat.PYSPY_JSON),
    ("not_hung_fast_steps_two_rounds.txt", "not_hung_fast_steps", DumpFormat.PYSPY_TEXT),
]


# Dumps that hold neither source lines nor call arguments: nothing says which op runs on a
# passed group, and the minority op's rank is named, at low confidence (the job's snapshot,
# whose call lines show rank 3 in a passed group's collective, names no one)
NO_SCOPE = {"mismatch_wrapper_two_callers.txt": [3], "mismatch_wrapper_two_callers_list.json": [3]}


@pytest.mark.parametrize(("name", "job", "fmt"), RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_dumps_get_their_jobs_verdict_and_culprits(name, job, fmt) -> None:
    verdict, culprits = expected(job)
    assert sniff((DUMPS / name).read_text()) is fmt
    diagnosis = analyse(load_evidence(DUMPS / name))
    if name in NO_SCOPE:
        culprits = NO_SCOPE[name]
        assert diagnosis.confidence.value == "low"
    assert (diagnosis.verdict.value, list(diagnosis.culprit_ranks)) == (verdict, culprits)


def test_one_dump_per_process_says_progress_is_unknown() -> None:
    snapshot = load_evidence(DUMPS / "mismatch_wrapper_two_callers.txt")
    assert all(len(r.samples) == 1 and r.samples[0].t == 0.0 for r in snapshot.ranks)
    assert any("whether the job moves is unknown" in n.words() for n in snapshot.notes)
    diagnosis = analyse(snapshot)
    # one sample (medium by itself) of dumps whose job size nothing shows: low, and both why
    assert diagnosis.confidence.value == "low"
    assert any("1 sample only" in b for b in diagnosis.basis)
    assert "the job's size is unknown: ranks not captured may be elsewhere" in diagnosis.basis


def test_ranks_from_file_order_are_said() -> None:
    snapshot = load_evidence(DUMPS / "mismatch_wrapper_two_callers.txt")
    assert [r.process.pid for r in snapshot.ranks] == [2497, 2498, 2499, 2500]
    assert {r.process.rank_source for r in snapshot.ranks} == {RankSource.INFERRED}
    assert snapshot.ranks[3].process.rank_evidence == "dump 4 of 4 in the file"
    assert any("order of the dumps" in n.words() for n in snapshot.notes)
    assert any("no world size shown" in n.words() for n in snapshot.notes)


def test_ranks_from_command_lines_win_over_file_order() -> None:
    """The native dumps were taken in reverse rank order; --local_rank=N tells them apart."""
    snapshot = load_evidence(DUMPS / "straggler_forked_worker_lock_native.txt")
    assert [(r.process.pid, r.rank) for r in snapshot.ranks] == [(3542, 2), (3541, 1), (3540, 0)]
    assert snapshot.ranks[0].process.rank_evidence.startswith("--local_rank=2 on its command")
    assert snapshot.ranks[0].process.local_rank == 2


def test_dataloader_workers_are_left_out_and_named() -> None:
    snapshot = load_evidence(DUMPS / "straggler_forked_worker_lock_all_processes.txt")
    assert [r.rank for r in snapshot.ranks] == [0, 1, 2]
    (note,) = [n.words() for n in snapshot.notes if n.words().startswith("left out")]
    assert "DataLoader worker" in note and note.count("pid ") == 6


def test_ranks_from_the_lines_before_each_dump() -> None:
    snapshot = load_evidence(DUMPS / "mismatch_pipeline_short_last_batch_p2p_labelled.txt")
    assert [r.rank for r in snapshot.ranks] == [0, 1, 2, 3]
    assert "=== rank 3" in snapshot.ranks[3].process.rank_evidence


def test_two_rounds_of_dumps_are_two_samples_each() -> None:
    snapshot = load_evidence(DUMPS / "not_hung_fast_steps_two_rounds.txt")
    assert [len(r.samples) for r in snapshot.ranks] == [2, 2]
    assert any("dumped more than once" in n.words() for n in snapshot.notes)
    diagnosis = analyse(snapshot)
    assert RankState.PROGRESSING in {r.state for r in diagnosis.ranks}


def _json_values(text: str) -> list[object]:
    decoder, values, i = json.JSONDecoder(), [], 0
    while text[i:].strip():
        i += len(text[i:]) - len(text[i:].lstrip())
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    return values


def test_json_dumps_with_label_lines_between_them(tmp_path) -> None:
    """The recorded --json dumps, written in reverse order with a loop's echo before each."""
    values = _json_values((DUMPS / "mismatch_pipeline_short_last_batch_p2p.json").read_text())
    path = tmp_path / "labelled.json"
    path.write_text("".join(f"== rank {r} ==\n{json.dumps(values[r])}\n" for r in (3, 2, 1, 0)))
    snapshot = load_evidence(path)
    assert [r.rank for r in snapshot.ranks] == [3, 2, 1, 0]
    diagnosis = analyse(snapshot)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (1, 3))


def test_a_single_json_dump_and_gzip(tmp_path) -> None:
    first = _json_values((DUMPS / "mismatch_pipeline_short_last_batch_p2p.json").read_text())[0]
    path = tmp_path / "one.json.gz"
    path.write_bytes(gzip.compress(json.dumps(first).encode()))
    snapshot = load_evidence(path)
    assert len(snapshot.ranks) == 1 and snapshot.ranks[0].process.pid == 3955
    text = tmp_path / "dumps.txt.gz"
    text.write_bytes(gzip.compress((DUMPS / "mismatch_wrapper_two_callers.txt").read_bytes()))
    assert len(load_evidence(text).ranks) == 4


def test_a_saved_snapshot_still_loads(tmp_path) -> None:
    snapshot = make_snapshot([make_rank(0, ["t.py:main:3"]), make_rank(1, ["t.py:main:3"])])
    path = tmp_path / "snap.json.gz"
    save_snapshot(snapshot, path)
    assert load_evidence(path) == snapshot


def test_recorded_ray_stack() -> None:
    """Real ``ray stack`` output of ``tests/jobs/ray/actors_hang.py mismatch`` (w0 broadcasts
    the learning rate while w1 and w2 all_reduce: w0 is the culprit). It lists every Ray
    worker of the node: Ray's own agents and, from another Ray instance that ran on the
    machine at the time, idle workers; only the actors in torch.distributed are ranks."""
    snapshot = load_evidence(DUMPS / "ray_stack_actors_mismatch.txt")
    assert [r.process.pid for r in snapshot.ranks] == [11817, 11818, 11940]
    assert {r.process.cmdline for r in snapshot.ranks} == {("ray::Worker.train",)}
    assert any("another actor class than Worker" in n.words() for n in snapshot.notes)
    assert any("idle Ray worker" in n.words() for n in snapshot.notes)
    diagnosis = analyse(snapshot)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (0,))


def ray_stack_text() -> str:
    """``ray stack`` output assembled in the layout of Ray's ``scripts.py`` (``stack``: for
    every worker ``ps aux`` lists, ``echo "Stack dump for $worker"``, then ``py-spy dump
    --native`` of its pid, then ``echo``) around the recorded ``--native`` dumps, plus an
    idle worker and one py-spy could not read (the recorded one has neither)."""
    native = (DUMPS / "straggler_forked_worker_lock_native.txt").read_text()
    blocks = sorted(re.split(r"(?m)^(?=Process \d+:)", native)[1:], key=lambda b: int(b.split()[1].rstrip(":")))
    out = []
    for block in blocks:
        pid = block.split()[1].rstrip(":")
        out.append(
            f"Stack dump for root     {pid}  0.3  1.1 4372120 612064 ?   Sl   10:54   0:04 ray::Worker.train\n{block}\n"
        )
    out.append(
        "Stack dump for root     3600  0.0  0.4 2120044 160512 ?   Sl   10:53   0:01 "
        "ray::IDLE\nProcess 3600: ray::IDLE\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 3600 (idle): "MainThread"\n    main_loop (ray/_private/worker.py:946)\n'
        "    <module> (ray/_private/workers/default_worker.py:330)\n\n"
    )
    out.append(
        "Stack dump for root     3601  0.0  0.4 2120044 160512 ?   Sl   10:53   0:01 "
        "ray::Worker.train\nError: Permission Denied: Try running again with elevated "
        "permissions\n\n"
    )
    return "".join(out)


def test_ray_stack_output(tmp_path) -> None:
    path = tmp_path / "ray_stack.txt"
    path.write_text(ray_stack_text())
    assert sniff(path.read_text()) is DumpFormat.RAY_STACK
    snapshot = load_evidence(path)
    assert [r.process.pid for r in snapshot.ranks] == [3540, 3541, 3542, 3601]
    assert snapshot.ranks[0].process.cmdline == ("ray::Worker.train",)
    unreadable = snapshot.ranks[3].samples[0].error
    assert unreadable is not None and unreadable.kind is CaptureErrorKind.PTRACE_DENIED
    assert any("idle Ray worker" in n.words() and "pid 3600" in n.words() for n in snapshot.notes)
    diagnosis = analyse(snapshot)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.STRAGGLER, (1,))


# ------------------------------------------------------------------- public dumps


def test_public_single_process_dump_says_what_it_can() -> None:
    """DeepSpeedExamples#302: one training process stuck in torch's JIT build lock
    (``file_baton.wait``), outside any collective. Nothing distributed is stuck: hangdoc
    says so (unknown, low) instead of naming a culprit, and where the process waits."""
    path = DUMPS / "public" / "deepspeedexamples_302_jit_build_lock.txt"
    assert "https://github.com/deepspeedai/DeepSpeedExamples/issues/302" in path.read_text()
    snapshot = load_evidence(path)
    (rank,) = snapshot.ranks
    assert (rank.rank, rank.process.pid, rank.process.local_rank) == (0, 46930, 0)
    diagnosis = analyse(snapshot)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.UNKNOWN, ())
    assert "file_baton.py:42" in diagnosis.ranks[0].detail


# ------------------------------------------------------------------- the CLI


def test_cli_analyze_a_text_dump(capsys) -> None:
    assert main(["analyze", str(DUMPS / "straggler_forked_worker_lock_native.txt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["verdict"], report["culprit_ranks"]) == ("straggler", [1])
    assert any("local ranks on the command lines" in n for n in report["notes"])


def test_cli_terminal_report_of_a_json_dump(capsys) -> None:
    path = DUMPS / "mismatch_wrapper_two_callers_list.json"
    assert main(["analyze", str(path), "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "collective_mismatch" in out and "py-spy dump --json output" in out


def _cli_error(capsys, path, needle: str, json_out: bool = False) -> str:
    assert main(["analyze", str(path), *(["--json"] if json_out else [])]) == 6
    captured = capsys.readouterr()
    first, *rest = captured.err.splitlines()
    assert first.startswith("hangdoc: error:") and needle in first, first
    assert "Traceback" not in captured.err and rest and rest[0].startswith("  help:")
    if json_out:
        assert json.loads(captured.out)["error"]["kind"] == "DumpFileError"
    return first


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("hello world\n", "neither a hangdoc snapshot nor a stack dump"),
        ("[1, 2, 3]\n", "is a list of numbers, not a py-spy dump"),
        ('[[{"thread_id": 1}], "x"]', "is a list of lists and strings, not a py-spy dump"),
        ('[{"thread_id": "x", "frames": []}]', "thread 0: 'thread_id' is 'x'"),
        (
            '[{"thread_id": 1, "frames": [{"name": "f", "filename": 3}]}]',
            "frame 0: 'filename' is a number, not a string",
        ),
        ('[{"thread_id": 1, "frames": [', "not valid JSON (truncated?)"),
        ("[" * 200_000, "nested too deeply"),
        ('[{"thread_id": 1, "pid": 5}, {"thread_id": 2, "pid": 6}]', "several processes"),
        ("[[]]\n", "without a single dump"),
    ],
)
def test_malformed_dumps_are_one_line_errors(tmp_path, capsys, content, needle) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    line = _cli_error(capsys, path, needle)
    assert "bad.txt" in line and len(line) < 400
    with pytest.raises(DumpFileError):
        load_evidence(path)


def test_errors_in_json_too(tmp_path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[true]")
    _cli_error(capsys, path, "not a py-spy dump", json_out=True)


def test_a_dump_file_too_large_is_refused(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(dumpfile, "MAX_DUMP_BYTES", 1000)
    _cli_error(capsys, DUMPS / "mismatch_wrapper_two_callers.txt", "more than the 0 MiB")


def test_a_deep_thread_is_refused(tmp_path, capsys, monkeypatch) -> None:
    from hangdoc.capture.dumps import dumptext

    monkeypatch.setattr(dumptext, "MAX_STACK_DEPTH", 3)
    _cli_error(capsys, DUMPS / "mismatch_wrapper_two_callers.txt", "more than 3 frames")


def test_dump_errors_are_bundle_errors() -> None:
    """Callers that catch a bad snapshot file catch a bad dump file too (same exit code)."""
    assert issubclass(DumpFileError, BundleError) and DumpFileError.exit_code == 6
    assert "py-spy dump" in DumpFileError.help and "ray stack" in DumpFileError.help


def test_a_process_without_threads_is_unreadable_not_an_error(tmp_path) -> None:
    path = tmp_path / "cut.txt"
    path.write_text((DUMPS / "mismatch_wrapper_two_callers.txt").read_text() + "Process 2600: python x.py\n")
    snapshot = load_evidence(path)
    last = snapshot.ranks[-1].samples[0]
    assert last.error is not None and "shows no thread" in last.error.message
    assert analyse(snapshot).ranks[-1].state is RankState.UNREADABLE


# ------------------------------------------------------------------- whatever the file holds


def _mutations(text: str, rng) -> list[str]:  # type: ignore[no-untyped-def]
    lines = text.splitlines(keepends=True)
    cut = rng.randrange(len(text) + 1)
    out = [text[:cut], text[cut:]]  # truncated, and the rest only
    drop = rng.randrange(len(lines))
    out.append("".join(lines[:drop] + lines[drop + 1 :]))
    chars = list(text)
    for _ in range(8):
        chars[rng.randrange(len(chars))] = rng.choice('()[]{}:"0x9 \n\t,-…\x00\udcff')
    out.append("".join(chars))
    k = rng.randrange(len(lines))
    out.append(
        "".join(
            lines[:k]
            + [
                rng.choice(
                    [
                        "Thread 1" + "9" * 30 + " (idle)\n",
                        "Process 99999999999: x\n",
                        "    f (a.py:" + "9" * 12 + ")\n",
                        "        Locals:\n",
                        "Error: \n",
                        "Stack dump for x\n",
                        "[\n",
                        "Caused by:\n",
                    ]
                )
            ]
            + lines[k:]
        )
    )
    return out


@pytest.mark.parametrize("name", [r[0] for r in RECORDED] + ["ray_stack_actors_mismatch.txt"])
def test_mutated_dumps_give_a_snapshot_or_one_error(tmp_path, name) -> None:
    """Truncated, cut, garbled: a snapshot the analysis takes, or a BundleError; never
    another exception."""
    import random

    rng = random.Random(name)
    text = (DUMPS / name).read_text()
    path = tmp_path / "mutated"
    for _ in range(12):
        for mutated in _mutations(text, rng):
            path.write_bytes(mutated.encode("utf-8", "surrogateescape"))
            try:
                snapshot = load_evidence(path)
            except BundleError as err:
                assert "\n" not in str(err)
                continue
            analyse(snapshot)


def test_one_pid_on_two_nodes_is_two_processes_when_their_ranks_show(tmp_path) -> None:
    """Containers on different nodes often give their ranks the same pids: the same pid
    with another rank before it is another process, not a second sample."""
    text = (DUMPS / "mismatch_wrapper_two_callers.txt").read_text()
    node = "Process 2497:" + text.split("Process 2497:")[1].split("Process 2498:")[0]
    path = tmp_path / "two_nodes.txt"
    path.write_text(f"== rank 0 ==\n{node}== rank 1 ==\n{node}")
    snapshot = load_evidence(path)
    assert [(r.rank, r.process.pid, len(r.samples)) for r in snapshot.ranks] == [(0, 2497, 1), (1, 2497, 1)]
    path.write_text(f"{node}{node}")  # no rank shown: a second sample of the same process
    assert [len(r.samples) for r in load_evidence(path).ranks] == [2]


def test_py_spy_errors_between_json_dumps(tmp_path) -> None:
    values = _json_values((DUMPS / "mismatch_pipeline_short_last_batch_p2p.json").read_text())
    path = tmp_path / "with_error.json"
    path.write_text(
        json.dumps(values[0]) + "\n== pid 4242 ==\nError: Permission Denied\n" + json.dumps(values[1]) + "\n"
    )
    snapshot = load_evidence(path)
    assert [r.process.pid for r in snapshot.ranks] == [3955, 4242, 3956]
    error = snapshot.ranks[1].samples[0].error
    assert error is not None and error.kind is CaptureErrorKind.PTRACE_DENIED


@pytest.mark.parametrize("name", ["mismatch_wrapper_two_callers.txt", "straggler_forked_worker_lock_native.txt"])
def test_one_dump_each_claims_no_time_it_did_not_watch(name: str) -> None:
    """Seen once, a rank shows no CPU, no I/O and no idle time: the report must not say
    "nothing moved over 0.0 s" or "idle for only 0.0 s", and points to a second dump."""
    diagnosis = analyse(load_evidence(DUMPS / name))
    said = " ".join((*(e.words() for e in diagnosis.evidence), *diagnosis.basis))
    assert "0.0 s" not in said and "0.0%" not in said
    assert "a second dump of each process" in said
