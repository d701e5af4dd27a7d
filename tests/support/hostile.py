"""A job whose names look like rich markup (issue 23, item 5): rank 1 hangs in a function
named ``[/]x`` with a thread ``reader[/dev/sda]``, and every sentence of its diagnosis
quotes them, with ``[bold red]``, ``[link=http://x]`` and an emoji code besides."""

from __future__ import annotations

from hangdoc.model import Diagnosis, Evidence, Frame, JobSnapshot, Note, NoteKind, RankState, Unreachable, Verdict

from .factories import make_diagnosis, make_op, make_rank, make_snapshot

FUNCTION = "[/]x"
THREAD = "reader[/dev/sda]"
STYLE = "[bold red]"
LINK = "[link=http://x]"
EMOJI = ":thumbs_up:"
NAMES = (FUNCTION, THREAD, STYLE, LINK, EMOJI)

AR = ["train.py:main:10", "train.py:step:20", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
HUNG = Frame(FUNCTION, f"/job/{STYLE}/{THREAD}.py", 5, code=f"lock.acquire()  # {LINK}")
READER = Frame(LINK, f"/job/{STYLE}/reader.py", 9)


def hostile() -> tuple[Diagnosis, JobSnapshot]:
    """The diagnosis (a straggler, culprit rank 1) and the snapshot: names in frames, thread,
    host, command line, job spec, an unreachable agent, a note, and the sentences."""
    hung = ["train.py:main:10", HUNG, "threading.py:acquire:100"]
    reader = ["threading.py:_bootstrap:1000", READER, "threading.py:wait:300"]
    snap = make_snapshot(
        [
            make_rank(0, AR, host=f"node{STYLE}"),
            make_rank(1, hung, threads={THREAD: reader}),
            make_rank(2, AR, cmdline=("python", f"{LINK}.py")),
        ],
        world_size=4,
        spec=f"pid:1{EMOJI}",
        unreachable=[Unreachable(f"{STYLE}:7420", f"refused {FUNCTION}", (3,))],
        notes=[
            Note(
                f"not counted as ranks ({THREAD})", NoteKind.NOT_RANKS, node=f"node{STYLE}", pids=(77,), listed="pid 77"
            )
        ],
    )
    said = f"rank 1 is blocked in {FUNCTION} ({THREAD}.py:5) on thread {THREAD} {STYLE} {LINK} {EMOJI}"
    diagnosis = make_diagnosis(
        snap,
        verdict=Verdict.STRAGGLER,
        culprits=[1],
        summary=said,
        evidence=[Evidence(said)],
        next_steps=[said],
        ops={0: make_op("all_reduce", AR[1]), 2: make_op("all_reduce", AR[1])},
        states={1: RankState.BLOCKED},
        details={1: f"thread {THREAD!r} in {FUNCTION}"},
    )
    return diagnosis, snap
