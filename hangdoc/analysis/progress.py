"""Decide, per rank and for the job, whether anything moved during the sampling window.

Stacks alone lie both ways: a healthy rank can sit in one long collective while megabytes
move, and a rank spinning in a tight loop changes line numbers without progressing. So a
rank's movement is judged from its CPU time, its read/write byte counters (socket traffic
included) and whether its *distributed* op changed between samples.

Counters are read per thread where capture has them (``ProcessState.threads``): for a rank
in a distributed op, the CPU and bytes of its other Python threads that are in no op (a
metrics or pin-memory thread, an async checkpoint writer) are not the op's, and do not make
a stuck wait look like data moving; the threads py-spy does not list (gloo's and NCCL's
workers, which do the op's work) still count. Wake-ups are those of the op's own thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..model import (
    DistOp,
    JobSnapshot,
    Origin,
    ProcessState,
    RankSnapshot,
    Sample,
    Stack,
    ThreadCounters,
    ThreadStack,
)
from .ops import Recogniser, exit_frame

# A rank using less than this share of one core is idle (a gloo/NCCL wait uses ~0).
CPU_BUSY_FRACTION = 0.20
CPU_MOVING_FRACTION = 0.05
# Bytes read+written per second that count as data moving (socket traffic included).
BYTES_MOVING_PER_SECOND = 64 * 1024
# Each blocking py-spy dump stops and resumes the process: the main thread of a rank that
# sleeps in a wait is context-switched about twice per dump (measured on gloo waits). More
# switches than that mean the thread woke up by itself: a wait completed and began again.
SWITCHES_PER_DUMP = 2
WAKEUPS_MOVING = 4
# ... plus this many per dump: under load a pause occasionally costs a third switch
WAKEUPS_NOISE_PER_DUMP = 0.25
# Waits that poll (the TCPStore server during rendezvous, monitored_barrier, spinning
# GPU syncs) wake hundreds of times a second whether or not anything completes: a rate
# above this says nothing about progress.
WAKEUPS_POLLING_PER_SECOND = 50.0


@dataclass(frozen=True, slots=True)
class Movement:
    """What changed for one rank between its first and last good sample."""

    seconds: float
    # CPU seconds per wall second: all threads, or for a rank in an op, all but its side
    # threads (Python threads in no distributed op) where per-thread counters exist
    cpu_fraction: float | None
    bytes_per_second: float | None  # read + written, side threads left out as for the CPU
    # context switches of the relevant thread (the main thread without per-thread
    # counters) beyond those hangdoc's pauses cause
    wakeups: int | None
    dumps: int  # blocking py-spy dumps between the first and last counters
    op_changed: bool  # the distributed op (name/call site) differed between samples
    left_op: bool  # some sample had the relevant thread outside any distributed op
    stack_changed: bool  # the relevant thread's stack differed between samples
    status: str | None  # last seen process status
    side_cpu_fraction: float | None = None  # the side threads' CPU, left out of cpu_fraction
    # no counters at all (a dump file): py-spy's own mark, the relevant thread "active" (on
    # CPU) in every sample; None where counters exist
    marked_active: bool | None = None

    @property
    def busy(self) -> bool:
        if self.cpu_fraction is None:
            return bool(self.marked_active)
        return self.cpu_fraction >= CPU_BUSY_FRACTION

    @property
    def woke(self) -> bool:
        """The main thread woke up by itself: a blocking call returned during the window."""
        if self.wakeups is None or self.wakeups < WAKEUPS_MOVING + WAKEUPS_NOISE_PER_DUMP * self.dumps:
            return False
        return self.wakeups / max(self.seconds, 1e-3) <= WAKEUPS_POLLING_PER_SECOND

    @property
    def moving_bytes(self) -> bool:
        """Bytes read or written at a rate that counts as data moving."""
        return self.bytes_per_second is not None and self.bytes_per_second >= BYTES_MOVING_PER_SECOND

    @property
    def moving(self) -> bool:
        cpu = self.cpu_fraction is not None and self.cpu_fraction >= CPU_MOVING_FRACTION
        io = self.bytes_per_second is not None and self.bytes_per_second >= BYTES_MOVING_PER_SECOND
        return cpu or io


def relevant_thread(
    sample: Sample,
    snapshot: JobSnapshot | None = None,
    recogniser: Recogniser | None = None,
    gpu: bool = False,
) -> tuple[ThreadStack | None, DistOp | None]:
    """The thread that matters for a rank: a main thread running the interpreter's exit
    (``ops.exit_frame``), else the one in a distributed op (main first), else main (or the
    thread running the job's code), with the device work it waits for at a
    host sync, if any (``device``; ``gpu``: the rank runs on a GPU, so a host-syncing line
    of the job's code counts). Only that thread's host sync counts: a side thread's
    ``.item()`` (a metrics thread) is not what the rank waits in.

    An analysis passes its ``recogniser`` (of ``snapshot``); without one, one is made."""
    rec = recogniser if recogniser is not None else Recogniser(snapshot)
    main = sample.main_thread
    if main is not None and exit_frame(main) is not None:
        # the process is exiting (an uncaught exception, the script's end): what keeps it
        # alive is the exit (joining a worker, an exit handler), whatever its other threads
        # wait in; its peers wait for a rank that will not come back
        return main, rec.recognise(main)
    ordered = ([main] if main else []) + [t for t in sample.threads if t is not main]
    for thread in ordered:
        op = rec.recognise(thread)
        if op is not None:
            return thread, op
    job = _running_the_job(main, ordered)
    return job, rec.device_wait(job, gpu) if job is not None else None


def _running_the_job(main: ThreadStack | None, ordered: Sequence[ThreadStack]) -> ThreadStack | None:
    """With no thread in a distributed op: the main thread, unless it runs none of the job's
    own code (a Ray actor's main thread idles in Ray's task loop while the training function
    runs in a thread of its own); then the first thread that does."""
    if main is None or any(f.origin.kind is Origin.USER for f in main.frames if not f.native):
        return main
    for thread in ordered:
        if any(f.origin.kind is Origin.USER for f in thread.frames if not f.native):
            return thread
    return main


def _without_native(thread: ThreadStack, frames: Stack) -> ThreadStack:
    """``thread`` with its Python ``frames`` only; its kept arguments follow their frames."""
    if not thread.locals:
        return replace(thread, frames=frames)
    position: dict[int, int] = {}
    for index, frame in enumerate(thread.frames):
        if not frame.native:
            position[index] = len(position)
    kept = tuple(replace(found, index=position[found.index]) for found in thread.locals if found.index in position)
    return replace(thread, frames=frames, locals=kept)


def _python_only(sample: Sample, rec: Recogniser) -> Sample:
    """``sample`` with its Python frames only (``sample`` itself when it has no native ones)."""
    threads = tuple(
        th if (frames := rec.python_frames(th.frames)) is th.frames else _without_native(th, frames)
        for th in sample.threads
    )
    if all(new is old for new, old in zip(threads, sample.threads, strict=False)):
        return sample
    return replace(sample, threads=threads)


def movement(
    rank: RankSnapshot,
    snapshot: JobSnapshot | None = None,
    recogniser: Recogniser | None = None,
    gpu: bool = False,
) -> Movement | None:
    """None when the rank has fewer than one good sample. An analysis passes its
    ``recogniser`` (of ``snapshot``); without one, one is made. ``gpu``: as for
    ``relevant_thread``."""
    good = rank.good_samples
    if not good:
        return None
    rec = recogniser if recogniser is not None else Recogniser(snapshot)
    return rank_movement(rank, good, stack_motion(good, rec, gpu))


@dataclass(frozen=True, slots=True)
class StackMotion:
    """What a rank's stacks say of its movement over its good samples (``stack_motion``),
    apart from its counters: the same for every rank whose good samples hold the same
    stacks (``views`` works it out once for all of them)."""

    op_changed: bool  # as ``Movement``'s
    left_op: bool
    stack_changed: bool
    all_active: bool  # the relevant thread active in every sample
    # where the relevant thread of the last good sample is among its threads, and whether
    # it is in a distributed op
    relevant: int | None
    in_op: bool
    # where that sample's Python threads in no distributed op are: its side threads, the
    # relevant one and threads without a native id left out per rank (``rank_movement``)
    idle: tuple[int, ...]


def stack_motion(good: Sequence[Sample], rec: Recogniser, gpu: bool = False) -> StackMotion:
    """The ``StackMotion`` of a rank's ``good`` samples (at least one)."""
    ops = []
    stacks = []
    active = []
    thread = op = None
    python = good[-1]
    for sample in good:
        # compare Python frames only: a native sample taken on demand must not look like motion
        python = _python_only(sample, rec)
        thread, op = relevant_thread(python, recogniser=rec, gpu=gpu)
        ops.append(rec.op_key(op) if op else None)
        stacks.append(thread.frames if thread else ())
        active.append(thread is not None and thread.active)
    relevant = next((i for i, th in enumerate(python.threads) if th is thread), None)
    last = good[-1]
    return StackMotion(
        op_changed=len(set(ops)) > 1,
        left_op=any(o is None for o in ops) and any(o is not None for o in ops),
        stack_changed=any(s != stacks[0] for s in stacks[1:]),  # no hashing of whole stacks
        all_active=all(active),
        relevant=relevant,
        in_op=op is not None,
        idle=tuple(i for i, th in enumerate(last.threads) if rec.recognise(th) is None),
    )


def rank_movement(rank: RankSnapshot, good: Sequence[Sample], motion: StackMotion) -> Movement:
    """The ``Movement`` of ``rank``, whose good samples are ``good`` (at least one) and whose
    stacks moved as ``motion`` says: its counters read against its stacks."""
    first, last = good[0], good[-1]
    with_state = [s for s in rank.samples if s.state is not None]
    seconds = last.t - first.t
    cpu = io = None
    wakeups = None
    if len(with_state) >= 2:
        a, b = with_state[0], with_state[-1]
        dt = max(b.t - a.t, 1e-6)
        seconds = max(seconds, b.t - a.t)
        assert a.state is not None and b.state is not None
        cpu = (b.state.cpu_seconds - a.state.cpu_seconds) / dt
        if a.state.read_chars is not None and b.state.read_chars is not None:
            moved = (b.state.read_chars - a.state.read_chars) + (
                (b.state.write_chars or 0) - (a.state.write_chars or 0)
            )
            io = moved / dt
        if a.state.ctx_switches is not None and b.state.ctx_switches is not None:
            pauses = SWITCHES_PER_DUMP * (len(with_state) - 1)
            wakeups = b.state.ctx_switches - a.state.ctx_switches - pauses
    side_cpu = None
    if len(with_state) >= 2 and motion.relevant is not None:
        a_state, b_state = with_state[0].state, with_state[-1].state
        assert a_state is not None and b_state is not None
        if a_state.threads and b_state.threads:  # per-thread counters (else ``_delta`` is None)
            thread = last.threads[motion.relevant]
            dt = max(with_state[-1].t - with_state[0].t, 1e-6)
            own = _delta(a_state, b_state, {thread.native_id})
            if own is not None and own.switches is not None:
                wakeups = own.switches - SWITCHES_PER_DUMP * (len(with_state) - 1)
            if motion.in_op and cpu is not None:
                side = _delta(a_state, b_state, _side_threads(last, thread, motion.idle))
                if side is not None:
                    side_cpu = side.cpu / dt
                    cpu = max(cpu - side_cpu, 0.0)
                    if io is not None and side.chars is not None:
                        io = max(io - side.chars / dt, 0.0)
    status = with_state[-1].state.status if with_state and with_state[-1].state else None
    return Movement(
        seconds=seconds,
        cpu_fraction=cpu,
        bytes_per_second=io,
        wakeups=wakeups,
        side_cpu_fraction=side_cpu,
        dumps=max(len(with_state) - 1, 0),
        op_changed=motion.op_changed,
        left_op=motion.left_op,
        stack_changed=motion.stack_changed,
        status=status,
        marked_active=motion.all_active if not with_state else None,
    )


@dataclass(frozen=True, slots=True)
class _Delta:
    """How much some threads' counters grew between two samples."""

    cpu: float
    switches: int | None
    chars: int | None


def _side_threads(sample: Sample, relevant: ThreadStack, idle: Sequence[int]) -> set[int | None]:
    """Native ids of the Python threads of ``sample`` in no distributed op (at the positions
    ``idle``), but the relevant one: a rank's side work (metrics, pin-memory, an async
    checkpoint writer)."""
    threads = sample.threads
    return {
        th.native_id
        for th in map(threads.__getitem__, idle)
        if th.thread_id != relevant.thread_id and th.native_id is not None
    }


def _delta(a: ProcessState, b: ProcessState, tids: set[int | None]) -> _Delta | None:
    """The growth of the counters of the threads ``tids`` seen in both states; None when
    the states have no per-thread counters (older captures, an unreadable /proc/PID/task)."""
    if not a.threads or not b.threads:
        return None
    cpu, switches, chars = 0.0, 0, 0
    known_switches = known_chars = True
    seen = False
    # by native id, the first of equal ids kept (as ``ProcessState.thread`` finds them)
    in_a: dict[int | None, ThreadCounters] = {c.native_id: c for c in reversed(a.threads)}
    in_b: dict[int | None, ThreadCounters] = {c.native_id: c for c in reversed(b.threads)}
    for tid in tids:
        before, after = in_a.get(tid), in_b.get(tid)
        if before is None or after is None:
            continue  # started or ended during the window
        seen = True
        cpu += max(after.cpu_seconds - before.cpu_seconds, 0.0)
        if before.ctx_switches is None or after.ctx_switches is None:
            known_switches = False
        else:
            switches += after.ctx_switches - before.ctx_switches
        if None in (before.read_chars, after.read_chars, before.write_chars, after.write_chars):
            known_chars = False
        else:
            chars += (after.read_chars or 0) - (before.read_chars or 0)
            chars += (after.write_chars or 0) - (before.write_chars or 0)
    if not seen and len(tids) == 1:
        return None  # the one thread asked for has no counters
    return _Delta(cpu, switches if known_switches and seen else None, chars if known_chars else None)


# where a rank's relevant thread is: its id and its Python frames' files and lines
StackPosition = tuple[int, tuple[tuple[str, int | None], ...]]


def stack_position(sample: Sample) -> StackPosition | None:
    """Where the rank's relevant thread is (the one in a distributed op, else main), to
    tell whether a rank moved between two samples: a background thread that keeps moving
    must not make a hung training loop look alive. None when the sample shows no stack."""
    if sample.error is not None or not sample.threads:
        return None
    thread, _op = relevant_thread(sample)
    if thread is None:
        return None
    return (thread.thread_id, tuple((f.filename, f.line) for f in thread.frames if not f.native))
