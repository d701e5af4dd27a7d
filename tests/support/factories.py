"""Build snapshots and diagnoses by hand for tests of analysis and reporting.

Frames are written compactly as ``"file:function:line"`` (``"file:function"`` when there
is no line) and stacks as lists of those, OUTERMOST FIRST, innermost last::

    snap = make_snapshot({
        0: ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"],
        1: ["train.py:main:12", "torch/distributed/distributed_c10d.py:barrier:4100"],
    })

Relative file names are expanded to the absolute paths py-spy reports, so that
``Frame.short_filename`` and the analysis' library/user checks see realistic input:
a bare name (``train.py``) lives in ``USER_DIR``, a standard-library module
(``threading.py``, ``multiprocessing/spawn.py``) in ``STDLIB_DIR``, any other relative
path with a directory (``torch/distributed/...``) in ``SITE_PACKAGES``. Absolute paths
and ``<frozen runpy>``-style names are kept as given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hangdoc import __version__
from hangdoc.analysis.merge import build_tree
from hangdoc.model import (
    CallTree,
    CaptureError,
    CaptureErrorKind,
    Diagnosis,
    DistOp,
    Evidence,
    Frame,
    FrameLocals,
    JobSnapshot,
    Note,
    OpKind,
    ProcessState,
    RankAnalysis,
    RankProcess,
    RankSnapshot,
    RankSource,
    RankState,
    Sample,
    SourceFile,
    Stack,
    StackGroup,
    ThreadCounters,
    ThreadStack,
    Unreachable,
    Verdict,
)

USER_DIR = "/job"
STDLIB_DIR = "/usr/lib/python3.11"
SITE_PACKAGES = "/venv/lib/python3.11/site-packages"
_STDLIB = frozenset(
    {"threading.py", "runpy.py", "queue.py", "selectors.py", "socket.py", "subprocess.py",
     "contextlib.py", "multiprocessing", "concurrent", "asyncio", "importlib", "logging"}
)  # fmt: skip

FrameLike = str | Frame
StackLike = Sequence[FrameLike] | Stack


def expand_filename(name: str) -> str:
    """The absolute path py-spy would report for a compact file name (see module doc)."""
    if name.startswith(("/", "<")):
        return name
    top = name.split("/", 1)[0]
    if top in _STDLIB:
        return f"{STDLIB_DIR}/{name}"
    if "/" in name:
        return f"{SITE_PACKAGES}/{name}"
    return f"{USER_DIR}/{name}"


def make_frame(spec: FrameLike, *, native: bool = False, code: str | None = None) -> Frame:
    """``make_frame("train.py:main:10")``; a ``Frame`` is returned unchanged."""
    if isinstance(spec, Frame):
        return spec
    parts = spec.split(":")
    if len(parts) >= 3 and parts[-1].isdigit():
        filename, function, line = ":".join(parts[:-2]), parts[-2], int(parts[-1])
    elif len(parts) >= 2:
        filename, function, line = ":".join(parts[:-1]), parts[-1], None
    else:
        raise ValueError(f"frame spec {spec!r} is not 'file:function[:line]'")
    return Frame(function, expand_filename(filename), line, native=native, code=code)


def make_stack(frames: StackLike = ()) -> Stack:
    """A stack (outermost first) from compact frame specs and/or ``Frame`` values."""
    return tuple(make_frame(f) for f in frames)


def make_op(
    name: str = "all_reduce",
    call_site: FrameLike | None = "train.py:train_step:30",
    *,
    kind: OpKind | None = None,
    via: str = "c10d call",
    peer: int | None = None,
    in_cleanup: bool = False,
    cleanup_frame: FrameLike | None = None,
) -> DistOp:
    """A ``DistOp``; ``kind`` defaults from the name (p2p names, init, cleanup, else collective)."""
    if kind is None:
        kind = _kind_of(name)
    return DistOp(
        kind=kind,
        name=name,
        call_site=make_frame(call_site) if call_site is not None else None,
        via=via,
        peer=peer,
        in_cleanup=in_cleanup,
        cleanup_frame=make_frame(cleanup_frame) if cleanup_frame is not None else None,
    )


def _kind_of(name: str) -> OpKind:
    if name in {"send", "recv", "isend", "irecv", "batch_isend_irecv"}:
        return OpKind.P2P
    if name in {"init_process_group", "new_group", "rendezvous", "_store_based_barrier"}:
        return OpKind.INIT
    if name == "destroy_process_group":
        return OpKind.CLEANUP
    return OpKind.COLLECTIVE


def make_thread(
    stack: StackLike,
    *,
    name: str = "MainThread",
    thread_id: int = 1,
    native_id: int | None = None,
    active: bool = False,
    owns_gil: bool = False,
) -> ThreadStack:
    return ThreadStack(thread_id, name, make_stack(stack), native_id, active, owns_gil)


def make_rank(
    rank: int | None,
    stack: StackLike = (),
    *,
    host: str = "node0",
    pid: int | None = None,
    samples: int = 3,
    interval: float = 0.5,
    stacks: Sequence[StackLike] | None = None,
    threads: Mapping[str, StackLike] | None = None,
    thread_name: str = "MainThread",
    active: bool = False,
    status: str = "sleeping",
    cpu_start: float = 10.0,
    cpu_per_sample: float = 0.0,
    io_per_sample: int = 0,
    ctx_per_sample: int = 0,
    error: CaptureErrorKind | CaptureError | None = None,
    gone_after: int | None = None,
    thread_cpu: Mapping[str, float] | None = None,
    arguments: Sequence[tuple[int, Mapping[str, str]]] = (),
    world_size: int | None = None,
    local_rank: int | None = None,
    rank_source: RankSource | None = RankSource.ENV,
    rank_evidence: str | None = None,
    env: Mapping[str, str] | None = None,
    cmdline: Sequence[str] = ("python", "train.py"),
    launcher_pid: int | None = None,
    thread_arguments: Mapping[str, Sequence[tuple[int, Mapping[str, str]]]] | None = None,
    thread_active: Mapping[str, bool] | None = None,
) -> RankSnapshot:
    """One rank sampled ``samples`` times, ``interval`` seconds apart.

    ``stack`` is the main thread's stack in every sample; ``stacks`` gives one stack per
    sample instead (a progressing rank). ``threads`` adds other threads (name -> stack).
    Counters grow by ``cpu_per_sample`` CPU seconds, ``io_per_sample`` bytes read and
    written, and ``ctx_per_sample`` context switches per sample (all zero: nothing moves).
    ``error`` makes every sample a capture failure; ``gone_after=n`` makes samples from
    index ``n`` on fail with ``PROCESS_GONE``. ``thread_cpu`` (thread name -> CPU seconds
    per sample) gives every state per-thread counters, the process's CPU growing by their
    sum plus ``cpu_per_sample``; ``arguments`` are the main thread's kept call arguments
    (frame index -> {name: value}; a negative index counts from the innermost frame);
    ``thread_arguments`` gives the other threads theirs (thread name -> the same), and
    ``thread_active`` which of them are on CPU.
    """
    pid = 1000 + (rank or 0) if pid is None else pid
    per_sample = [make_stack(s) for s in stacks] if stacks is not None else None
    if per_sample is not None:
        samples = len(per_sample)
    main = make_stack(stack)
    extra = {name: make_stack(s) for name, s in (threads or {}).items()}
    if isinstance(error, CaptureErrorKind):
        error = CaptureError(error, f"{error.value} (pid {pid})")
    taken = []
    for i in range(samples):
        t = round(i * interval, 6)
        if error is not None or (gone_after is not None and i >= gone_after):
            err = error or CaptureError(CaptureErrorKind.PROCESS_GONE, f"pid {pid} exited")
            taken.append(Sample(t=t, error=err))
            continue
        main_i = per_sample[i] if per_sample is not None else main
        kept = tuple(FrameLocals(index % len(main_i), tuple(values.items())) for index, values in arguments)
        thread_list = [ThreadStack(pid, thread_name, main_i, pid, active, active, kept)]
        thread_list += [
            ThreadStack(
                pid + 100 * (j + 1),
                name,
                s,
                pid + 100 * (j + 1),
                active=(thread_active or {}).get(name, False),
                locals=tuple(
                    FrameLocals(index % len(s), tuple(values.items()))
                    for index, values in (thread_arguments or {}).get(name, ())
                ),
            )
            for j, (name, s) in enumerate(extra.items())
        ]
        counters: tuple[ThreadCounters, ...] = ()
        if thread_cpu is not None:
            counters = tuple(
                ThreadCounters(
                    th.native_id or 0,
                    round(1.0 + i * thread_cpu.get(th.name or "", 0.0), 6),
                    ctx_switches=200 + i * ctx_per_sample if th.name == thread_name else 50,
                    read_chars=0,
                    write_chars=0,
                )
                for th in thread_list
            )
        state = ProcessState(
            status=status,
            threads=counters,
            cpu_seconds=round(cpu_start + i * (cpu_per_sample + sum((thread_cpu or {}).values())), 6),
            num_threads=len(thread_list),
            read_chars=1_000_000 + i * io_per_sample,
            write_chars=500_000 + i * io_per_sample,
            ctx_switches=200 + i * ctx_per_sample,
            rss_bytes=512 * 2**20,
        )
        taken.append(Sample(t=t, threads=tuple(thread_list), state=state))
    environment = dict(env or {})
    if rank is not None and rank_source is RankSource.ENV:
        environment.setdefault("RANK", str(rank))
    if world_size is not None:
        environment.setdefault("WORLD_SIZE", str(world_size))
    if rank_evidence is None:
        rank_evidence = f"RANK={rank}" if rank_source is RankSource.ENV else ""
    process = RankProcess(
        pid=pid,
        host=host,
        rank=rank,
        rank_source=rank_source if rank is not None else None,
        rank_evidence=rank_evidence,
        world_size=world_size,
        local_rank=local_rank if local_rank is not None else rank,
        cmdline=tuple(cmdline),
        env=tuple(sorted(environment.items())),
        launcher_pid=launcher_pid,
    )
    return RankSnapshot(process=process, samples=tuple(taken))


def make_snapshot(
    ranks: Mapping[int, StackLike] | Iterable[RankSnapshot] = (),
    *,
    spec: str = "127.0.0.1:29500",
    world_size: int | None = None,
    unreachable: Iterable[Unreachable] = (),
    window_seconds: float | None = None,
    captured_at: str = "2025-01-01T12:00:00Z",
    hangdoc_version: str = __version__,
    notes: Iterable[Note] = (),
    sources: Iterable[SourceFile] = (),
    **rank_kwargs: object,
) -> JobSnapshot:
    """A job snapshot from ``{rank: stack}`` (each built by ``make_rank(**rank_kwargs)``)
    or from ready ``RankSnapshot`` values. ``world_size`` defaults to the number of ranks;
    ``window_seconds`` to the last sample's time."""
    if isinstance(ranks, Mapping):
        built = [
            make_rank(r, s, **rank_kwargs)  # type: ignore[arg-type]
            for r, s in sorted(ranks.items())
        ]
    else:
        built = list(ranks)
    if window_seconds is None:
        window_seconds = max((s.t for r in built for s in r.samples), default=0.0)
    return JobSnapshot(
        spec=spec,
        ranks=tuple(built),
        world_size=len(built) if world_size is None else world_size,
        unreachable=tuple(unreachable),
        window_seconds=window_seconds,
        captured_at=captured_at,
        hangdoc_version=hangdoc_version,
        notes=tuple(notes),
        sources=tuple(sources),
    )


def main_stacks(snapshot: JobSnapshot) -> dict[int, Stack]:
    """Each rank's main-thread stack in its last good sample."""
    out: dict[int, Stack] = {}
    for rs in snapshot.ranks:
        good = rs.good_samples
        if rs.rank is None or not good:
            continue
        main = good[-1].main_thread
        if main is not None:
            out[rs.rank] = main.frames
    return out


def make_diagnosis(
    snapshot: JobSnapshot | None = None,
    *,
    verdict: Verdict = Verdict.COLLECTIVE_MISMATCH,
    culprits: Iterable[int] = (),
    summary: str = "",
    evidence: Iterable[Evidence] = (),
    next_steps: Iterable[str] = (),
    ops: Mapping[int, DistOp | None] | None = None,
    states: Mapping[int, RankState] | None = None,
    details: Mapping[int, str] | None = None,
    ranks: Iterable[RankAnalysis] | None = None,
    groups: Iterable[StackGroup] | None = None,
    tree: CallTree | None | bool = True,
    observed_seconds: float | None = None,
    partial: bool | None = None,
) -> Diagnosis:
    """A diagnosis of ``snapshot`` as the analysis would return it.

    Unless given, groups are the merged tree's equivalence classes of main-thread stacks,
    each rank's analysis comes from ``ops``/``states``/``details`` (state defaults to
    WAITING with an op, BUSY without), the tree is built from the main stacks
    (``tree=False`` leaves it None), and ``partial`` is true when the snapshot has
    unreachable nodes.
    """
    snapshot = snapshot if snapshot is not None else make_snapshot()
    ops = dict(ops or {})
    stacks = main_stacks(snapshot)
    call_tree = build_tree(stacks) if tree is True else (tree or None)
    if groups is None:
        classes = (call_tree or build_tree(stacks)).classes
        groups = [StackGroup(i, members, stack, ops.get(members[0])) for i, (members, stack) in enumerate(classes)]
    groups = tuple(groups)
    if ranks is None:
        group_of = {r: g.group_id for g in groups for r in g.ranks}
        ranks = [_rank_analysis(rs, ops, states or {}, details or {}, group_of) for rs in snapshot.ranks]
    if observed_seconds is None:
        observed_seconds = snapshot.window_seconds
    if partial is None:
        partial = bool(snapshot.unreachable)
    return Diagnosis(
        verdict=verdict,
        culprit_ranks=tuple(sorted(culprits)),
        summary=summary or f"Verdict {verdict.value}.",
        evidence=tuple(evidence),
        next_steps=tuple(next_steps),
        ranks=tuple(ranks),
        groups=groups,
        observed_seconds=observed_seconds,
        partial=partial,
        tree=call_tree,
    )


def _rank_analysis(
    rs: RankSnapshot,
    ops: Mapping[int, DistOp | None],
    states: Mapping[int, RankState],
    details: Mapping[int, str],
    group_of: Mapping[int, int],
) -> RankAnalysis:
    rank = rs.rank
    op = ops.get(rank) if rank is not None else None
    default = RankState.WAITING if op is not None else RankState.BUSY
    if not rs.good_samples:
        default = RankState.UNREADABLE
    return RankAnalysis(
        rank=rank,
        pid=rs.process.pid,
        host=rs.process.host,
        state=states.get(rank, default) if rank is not None else default,
        op=op,
        thread="MainThread" if rs.good_samples else None,
        group_id=group_of.get(rank) if rank is not None else None,
        detail=details.get(rank, "") if rank is not None else "",
    )
