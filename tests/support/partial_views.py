"""Part of a recorded job, as a user could come to hold it: the partial views of issue 24.

A verdict speaks only for the ranks seen. To check that it does, every recording (the
snapshots of ``tests/snapshots/``, the stack dumps and flight recorder dumps of
``tests/data/``) is replayed with ranks taken out, and the verdict over what is left is set
beside the verdict over everything recorded ("the whole job").

Which ranks are kept (``subsets``): each rank alone (at most 4, evenly spread), the first
half, every rank but one (each rank in turn: "every rank but the culprit" among them),
every rank but all the culprits, and, where the recording itself lacks ranks of the job
(``rank_missing``), every rank recorded.

How the hidden ranks are hidden (``Hiding``), each the way a user gets such a view:

- ``DUMPS``: the kept ranks read from dump files (``nodes_searched`` false): nobody looked
  for the others;
- ``NODE_LOST``: a live capture where the hidden ranks' node stopped answering, its ranks
  known (the coordinator's ``Unreachable`` with ``ranks``);
- ``NODE_SILENT``: a live capture where one agent never answered, so nobody knows which
  ranks it holds (``Unreachable`` without ranks).

Dump recordings are views from dumps already; they are only cut ``DUMPS``-wise.

What counts against the analysis (``Trial``), for each view:

- a **confident contradiction**: the view's confidence is medium or high, its verdict is
  not ``unknown``, and the whole job says otherwise: a different verdict (the whole job's
  ``unknown`` supports no confident claim), or a culprit the whole job does not name.
  Naming fewer culprits than the whole job (a subset of them, or none) is not one; nor is
  anything said at low confidence, nor ``unknown``;
- a **confident claim about a hidden rank**: medium or high confidence with a hidden rank
  among the culprits, even one the whole job names: that verdict rests on a rank nobody saw;
- a **rank called missing without evidence**, at any confidence: a hidden rank (it has a
  process: it was recorded) in the view's ``scope.absent``; from dumps or with a silent
  node, any rank there (a dump file is not a search of a node, and a silent node could
  hold any absent rank).

The goal for each is 0.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.capture.dumps.dumpfile import load_evidence
from hangdoc.model import Confidence, Diagnosis, JobSnapshot, Unreachable, Verdict

from .harness import JOBS_DIR, load_meta
from .paths import TESTS

SNAPSHOTS = TESTS / "snapshots"
DUMPS = TESTS / "data" / "dumps"
FLIGHT = TESTS / "data" / "flight"
# dumps ``hangdoc analyze`` refuses by design (function names only: nothing to analyse)
UNREADABLE = frozenset({"condensed/sglang_27489_arrow_fingerprint.txt"})
MAX_SINGLES = 4
CONFIDENT = (Confidence.MEDIUM, Confidence.HIGH)


class Hiding(enum.Enum):
    """How the ranks left out of a view are hidden from the analysis."""

    DUMPS = "dumps"
    """The kept ranks come from dump files; nobody searched for the others."""
    NODE_LOST = "node lost"
    """A live capture; the hidden ranks' node stopped answering (its ranks known)."""
    NODE_SILENT = "node silent"
    """A live capture; an agent never answered (which ranks it holds is unknown)."""


@dataclass(frozen=True)
class Recording:
    """One recorded job: a saved snapshot, or the dumps someone took of it."""

    name: str
    path: Path
    from_dumps: bool

    def load(self) -> JobSnapshot:
        return load_evidence(self.path) if self.from_dumps else load_snapshot(self.path)

    @property
    def hidings(self) -> tuple[Hiding, ...]:
        return (Hiding.DUMPS,) if self.from_dumps else tuple(Hiding)


def recordings() -> list[Recording]:
    """Every recording: the corpus snapshots, then stack dumps, then flight recorder dumps."""
    out = [Recording(p.name.removesuffix(".json.gz"), p, False) for p in sorted(SNAPSHOTS.glob("*.json.gz"))]
    dumps = sorted(
        p
        for p in DUMPS.rglob("*")
        if p.is_file() and p.suffix in (".txt", ".json") and str(p.relative_to(DUMPS)) not in UNREADABLE
    )
    out += [Recording(f"dumps/{p.relative_to(DUMPS)}", p, True) for p in dumps]
    out += [Recording(f"flight/{p.name}", p, True) for p in sorted(FLIGHT.iterdir()) if p.is_dir()]
    return out


def corpus_expectation(recording: Recording) -> tuple[str, tuple[int, ...]] | None:
    """A corpus snapshot's verdict and culprits from its job's header; None for dumps."""
    if recording.from_dumps:
        return None
    meta = load_meta(JOBS_DIR / f"{recording.name}.py")
    return meta.verdict, tuple(sorted(meta.culprits))


def subsets(
    recorded: tuple[int, ...], culprits: tuple[int, ...], world: int | None
) -> list[tuple[str, tuple[int, ...]]]:
    """(label, ranks kept) for the views of one recording, each set of ranks once.

    ``recorded``: the ranks in the recording, sorted; ``culprits``: the whole job's;
    ``world``: its size, where known. Every view keeps at least one rank and hides at
    least one rank of the job.
    """
    n = len(recorded)
    step = max(1, n // MAX_SINGLES)
    views: list[tuple[str, tuple[int, ...]]] = [(f"rank {r} alone", (r,)) for r in recorded[::step][:MAX_SINGLES]]
    views.append(("first half", recorded[: max(1, n // 2)]))
    for r in recorded:
        label = f"all but culprit {r}" if r in culprits else f"all but rank {r}"
        views.append((label, tuple(x for x in recorded if x != r)))
    seen_culprits = [c for c in culprits if c in recorded]
    if len(seen_culprits) > 1:
        views.append(("all but the culprits", tuple(x for x in recorded if x not in culprits)))
    if world is not None and n < world:
        views.append(("every rank recorded", recorded))
    out: list[tuple[str, tuple[int, ...]]] = []
    kept_sets: set[tuple[int, ...]] = set()
    for label, kept in views:
        whole = kept == recorded and (world is None or n >= world)
        if kept and not whole and kept not in kept_sets:
            kept_sets.add(kept)
            out.append((label, kept))
    return out


def view(snapshot: JobSnapshot, kept: tuple[int, ...], hiding: Hiding) -> JobSnapshot:
    """``snapshot`` with only the ranks ``kept`` (entries without a rank number stay)."""
    ranks = tuple(r for r in snapshot.ranks if r.rank is None or r.rank in kept)
    hidden = tuple(sorted({r.rank for r in snapshot.ranks if r.rank is not None} - set(kept)))
    part = dataclasses.replace(snapshot, ranks=ranks)
    if hiding is Hiding.DUMPS:
        return dataclasses.replace(part, nodes_searched=False)
    lost = Unreachable(
        "node-b:7420", "deadline exceeded: the agent did not answer", hidden if hiding is Hiding.NODE_LOST else ()
    )
    return dataclasses.replace(part, unreachable=(*snapshot.unreachable, lost))


@dataclass(frozen=True)
class Said:
    """What one diagnosis said, in brief."""

    verdict: str
    culprits: tuple[int, ...]
    confidence: str
    absent: tuple[int, ...] = ()

    @classmethod
    def of(cls, d: Diagnosis) -> Said:
        return cls(d.verdict.value, d.culprit_ranks, d.confidence.value, d.scope.absent)

    @property
    def confident(self) -> bool:
        return self.confidence in {c.value for c in CONFIDENT} and self.verdict != Verdict.UNKNOWN.value

    def __str__(self) -> str:
        return f"{self.verdict} {list(self.culprits)} ({self.confidence})"


@dataclass(frozen=True)
class Trial:
    """One view of one recording, and what the analysis said of it and of the whole."""

    recording: str
    subset: str
    hiding: Hiding
    kept: tuple[int, ...]
    hidden: tuple[int, ...]
    whole: Said
    part: Said

    @property
    def contradiction(self) -> bool:
        """Confident, and the whole job says another verdict or does not name a culprit."""
        return self.part.confident and (
            self.part.verdict != self.whole.verdict or not set(self.part.culprits) <= set(self.whole.culprits)
        )

    @property
    def claims_hidden(self) -> bool:
        """Confident, with a hidden rank among the culprits."""
        return self.part.confident and bool(set(self.part.culprits) & set(self.hidden))

    @property
    def missing_unproven(self) -> tuple[int, ...]:
        """Ranks called absent without positive evidence: hidden ones (they have a process),
        and from dumps or with a silent node any one at all."""
        if self.hiding is Hiding.NODE_LOST:
            return tuple(r for r in self.part.absent if r in self.hidden)
        return self.part.absent

    @property
    def faults(self) -> list[str]:
        return [
            name
            for name, bad in (
                ("contradiction", self.contradiction),
                ("claim about a hidden rank", self.claims_hidden),
                ("rank called missing", bool(self.missing_unproven)),
            )
            if bad
        ]

    def __str__(self) -> str:
        return (
            f"{self.recording}: {self.subset} (kept {list(self.kept)}, {self.hiding.value}): "
            f"{self.part}; whole job: {self.whole}"
        )


def trials(recording: Recording) -> Iterator[Trial]:
    """Every view of ``recording``, analysed."""
    snapshot = recording.load()
    whole = analyse(snapshot)
    recorded = tuple(sorted({r.rank for r in snapshot.ranks if r.rank is not None}))
    for label, kept in subsets(recorded, whole.culprit_ranks, whole.scope.world_size):
        hidden = tuple(r for r in recorded if r not in kept)
        for hiding in recording.hidings:
            if hiding is Hiding.NODE_LOST and not hidden:
                continue  # nothing to lose: the capture as it was
            part = analyse(view(snapshot, kept, hiding))
            yield Trial(recording.name, label, hiding, kept, hidden, Said.of(whole), Said.of(part))
