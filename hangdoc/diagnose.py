"""The pipeline: discover -> capture (adaptive window) -> analyse. Reporting is the CLI's.

Sampling goes on for ``window`` seconds; when the evidence is still ambiguous (one rank
busy while the others wait: a straggler, or a slow rank that will finish) it goes on, up
to ``max_window``, until the job either moves or stays put. The snapshot records how long
it watched and why.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from . import __version__
from .analyse import analyse
from .capture import sample_round
from .discover import Discovery, discover
from .errors import PermissionDenied
from .jobspec import parse_job_spec
from .model import Diagnosis, JobSnapshot, RankProcess, RankSnapshot, Sample, SourceFile
from .pyspy import find_pyspy
from .source import collect_sources

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How long and how deep to look. Defaults keep a diagnosis to a few seconds."""

    window: float = 2.0  # seconds of sampling before a first verdict
    interval: float = 0.5  # seconds between sample rounds
    max_window: float = 12.0  # upper bound when the evidence is ambiguous
    native: bool = False  # native frames on every sample (slow: ~1 s per dump)
    timeout: float = 5.0  # per py-spy dump


def diagnose(
    spec: str, options: CaptureOptions = CaptureOptions(), progress: Progress | None = None
) -> tuple[JobSnapshot, Diagnosis]:
    """Find the job's ranks on this node, watch them, and diagnose."""
    say = progress or (lambda _msg: None)
    job = parse_job_spec(spec)
    find_pyspy()  # fail fast, with install help, before looking at any process
    found = discover(job)
    say(f"found {len(found.ranks)} rank process(es) for {spec}" + _world(found))
    return watch(spec, found, options, say)


def _world(found: Discovery) -> str:
    return f" (world size {found.world_size})" if found.world_size else ""


def watch(
    spec: str, found: Discovery, options: CaptureOptions, say: Progress
) -> tuple[JobSnapshot, Diagnosis]:
    """Sample ``found``'s ranks until the verdict is clear or ``max_window`` is reached."""
    procs = list(found.ranks)
    samples: dict[int, list[Sample]] = {p.pid: [] for p in procs}
    sources: dict[str, dict[int, str]] = {}
    t0 = time.monotonic()
    notes = list(found.notes)
    deepened: set[int] = set()
    while True:
        t = time.monotonic() - t0
        live = [p for p in procs if not _gone(samples[p.pid])]
        for proc, sample in zip(live, sample_round(live, t, native=options.native, timeout=options.timeout)):
            samples[proc.pid].append(sample)
            _merge_sources(sources, collect_sources(sample.threads))
        elapsed = time.monotonic() - t0
        _check_readable(samples)
        snapshot = _snapshot(spec, found, procs, samples, sources, elapsed, notes)
        if elapsed < options.window:
            time.sleep(options.interval)
            continue
        deeper = _deepen(procs, samples, deepened, snapshot, options, t0)
        if deeper:
            say(f"took native frames of {len(deeper)} rank(s) whose Python stack ends in C++")
            notes.append(f"native frames taken of pid(s) {', '.join(map(str, deeper))}")
            snapshot = _snapshot(spec, found, procs, samples, sources, elapsed, notes)
        diagnosis = analyse(snapshot)
        if not diagnosis.extra.get("ambiguous") or elapsed >= options.max_window:
            if diagnosis.extra.get("ambiguous"):
                notes.append(f"evidence still ambiguous after {elapsed:.1f} s (max window)")
                snapshot = _snapshot(spec, found, procs, samples, sources, elapsed, notes)
                diagnosis = analyse(snapshot)
            return snapshot, diagnosis
        if not any(n.startswith("window extended") for n in notes):
            notes.append(
                f"window extended beyond {options.window:.1f} s: {diagnosis.summary.split(':')[0]} "
                "is not yet certain"
            )
            say("evidence ambiguous (a rank is busy while others wait): observing longer")
        time.sleep(options.interval)


def _check_readable(samples: dict[int, list[Sample]]) -> None:
    """Every rank refused to ptrace: nothing to diagnose, and the fix is the same for all."""
    last = [s[-1] for s in samples.values() if s]
    if last and all(x.error is not None and x.error.kind.value == "ptrace_denied" for x in last):
        raise PermissionDenied(
            f"ptrace was refused for all {len(last)} rank process(es): {last[0].error.message}"  # type: ignore[union-attr]
        )


def _gone(samples: Sequence[Sample]) -> bool:
    return bool(samples) and samples[-1].error is not None and samples[-1].error.kind.value == "process_gone"


def _merge_sources(into: dict[str, dict[int, str]], found: Sequence[SourceFile]) -> None:
    for src in found:
        into.setdefault(src.filename, {}).update(src.lines)


def _snapshot(
    spec: str,
    found: Discovery,
    procs: Sequence[RankProcess],
    samples: dict[int, list[Sample]],
    sources: dict[str, dict[int, str]],
    elapsed: float,
    notes: Sequence[str],
) -> JobSnapshot:
    return JobSnapshot(
        spec=spec,
        ranks=tuple(RankSnapshot(p, tuple(samples[p.pid])) for p in procs),
        world_size=found.world_size,
        window_seconds=round(elapsed, 3),
        captured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        hangdoc_version=__version__,
        notes=tuple(notes),
        sources=tuple(SourceFile(f, tuple(sorted(lines.items()))) for f, lines in sorted(sources.items())),
    )


_ENGINE = ("torch/autograd/graph.py", "torch/autograd/__init__.py", "torch/_tensor.py")


def _deepen(
    procs: Sequence[RankProcess],
    samples: dict[int, list[Sample]],
    done: set[int],
    snapshot: JobSnapshot,
    options: CaptureOptions,
    t0: float,
) -> list[int]:
    """Take one native sample of ranks idle inside the autograd engine (DDP's C++ reducer).

    Their Python stack ends in ``backward()``; only native frames show whether the engine
    waits in a gradient all-reduce. Done once per rank, and only when it matters.
    """
    if options.native:
        return []
    want = []
    for proc in procs:
        good = [s for s in samples[proc.pid] if s.error is None and s.threads]
        if proc.pid in done or not good:
            continue
        main = good[-1].main_thread
        inner = next((f for f in reversed(main.frames) if not f.native), None) if main else None
        if main and inner and any(inner.filename.endswith(e) for e in _ENGINE) and not main.active:
            want.append(proc)
    if not want:
        return []
    t = time.monotonic() - t0
    for proc, sample in zip(want, sample_round(want, t, native=True, timeout=max(options.timeout, 10.0))):
        done.add(proc.pid)
        if sample.error is None:
            samples[proc.pid].append(sample)
    return [p.pid for p in want]


def with_notes(snapshot: JobSnapshot, *notes: str) -> JobSnapshot:
    return replace(snapshot, notes=snapshot.notes + tuple(notes))
