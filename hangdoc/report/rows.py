"""What the reports say of each rank and of each class of ranks: the one place that decides
it for the terminal's rank table, the ``--html`` page (its rank table and rank panel) and
the picture's title.

- a rank's row: its op in words (``send (peer 3) [cleanup]``), its call site, its detail
  (blank where it only repeats the op and call site), its state in words: in a job that is
  not hung no rank is ``blocked`` (off CPU outside any op, a rank waits for I/O, a timer,
  its GPU: ``waiting``; on CPU, ``running``); the state stays the fact, only its words
  change;
- a class of ranks: the ranks in the same state, op and call site, culprits apart from
  the rest, ordered culprits first, then the largest, then by first rank; with its hosts
  and the detail its ranks share;
- the culprits in words: ``culprit: rank 3``, ``culprits: ranks 3, 5-7``.

Values here are the job's text as it came; each reporter passes them through
``errors.printable`` (and escapes them for its format) where it writes them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..model import DistOp, RankAnalysis, RankState, Verdict
from ..rankranges import count_text, cut_ranges

RANK_ROWS = 32  # a rank table has a row per rank up to this many ranks; beyond, one per class
CLASS_ROWS = 24  # classes a table lists; the rest are counted in one row
# A job that is not hung has no rank stuck: off CPU outside any op, a rank waits (for I/O, a
# timer, its GPU); on CPU, it runs.
_CALM_WORDS = {RankState.BLOCKED: "waiting", RankState.BUSY: "running"}


def state_word(state: RankState, verdict: Verdict) -> str:
    """A rank's state in words: its value (``blocked``), except that in a report whose
    verdict is ``not_hung`` no rank is ``blocked`` (``waiting``) or ``busy`` (``running``)."""
    if verdict is Verdict.NOT_HUNG:
        return _CALM_WORDS.get(state, state.value)
    return state.value


def op_text(op: DistOp | None) -> str:
    """The op a rank is in, for a table's op column: ``all_reduce``, ``send (peer 3)``,
    ``barrier [cleanup]``; ``—`` for none."""
    if op is None:
        return "—"
    text = op.name
    if op.peer is not None:
        text += f" (peer {op.peer})"
    if op.in_cleanup:
        text += " [cleanup]"
    return text


def call_site(ra: RankAnalysis) -> str:
    """Where the rank's op was called (``train.py:30``); ``""`` when unknown."""
    return ra.op.call_site.location if ra.op and ra.op.call_site else ""


def detail(ra: RankAnalysis) -> str:
    """A rank's detail, blank where it only says again what the op and call site columns
    say (``in all_reduce (train.py:30)``): a column of repeats that squeezes the others."""
    if (
        ra.op is not None
        and ra.op.call_site is not None
        and ra.detail == f"in {ra.op.describe()}"
        and ra.op.describe() == f"{ra.op.name} ({ra.op.call_site.location})"
    ):
        return ""
    return ra.detail


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank's row of a rank table, in the words every report uses."""

    rank: int | None
    host: str
    pid: int | None
    culprit: bool
    state: RankState
    state_word: str  # ``state_word(state, verdict)``
    op: str  # ``op_text``
    site: str  # ``call_site``
    detail: str  # ``detail``


def rank_rows(ranks: Sequence[RankAnalysis], culprits: Collection[int], verdict: Verdict) -> list[RankRow]:
    """A row per rank, in rank order (ranks without a number last)."""
    return [
        RankRow(
            rank=ra.rank,
            host=ra.host,
            pid=ra.pid,
            culprit=ra.rank is not None and ra.rank in culprits,
            state=ra.state,
            state_word=state_word(ra.state, verdict),
            op=op_text(ra.op),
            site=call_site(ra),
            detail=detail(ra),
        )
        for ra in sorted(ranks, key=lambda ra: (ra.rank is None, ra.rank or 0))
    ]


@dataclass(frozen=True, slots=True)
class RankClass:
    """Ranks in the same state, op and call site, culprits apart from the rest."""

    culprit: bool
    state: RankState
    state_word: str  # ``state_word(state, verdict)``
    op: str  # ``op_text``
    site: str  # ``call_site``
    members: tuple[RankAnalysis, ...]
    numbers: tuple[int, ...]  # the members' rank numbers, sorted and distinct

    @property
    def unnumbered(self) -> int:
        """How many members have no rank number."""
        return sum(1 for m in self.members if m.rank is None)

    def label(self, limit: int) -> str:
        """``[0-2,5]``, its ranges cut at a comma past about ``limit`` characters
        (``[0,2,4,…]``), then ``+2 unnumbered`` where members have no number."""
        unnumbered = self.unnumbered
        text = f"[{cut_ranges(self.numbers, limit)[0]}]" if self.numbers else ""
        return text + (f" +{unnumbered} unnumbered" if unnumbered else "")

    @property
    def hosts(self) -> str:
        """The members' hosts: one or two by name, more by their count (``12 hosts``)."""
        hosts = sorted({m.host for m in self.members if m.host})
        if len(hosts) <= 2:
            return ", ".join(hosts)
        return f"{count_text(len(hosts))} hosts"

    @property
    def detail(self) -> str:
        """The detail the members share (``detail``), or the commonest and how many others;
        ``""`` when none says more than its op."""
        said = _details(self.members)
        if not said:
            return ""
        common = Counter(said).most_common()
        text = common[0][0]
        return text if len(common) == 1 else f"{text} (and {len(common) - 1} other details)"


def rank_classes(ranks: Sequence[RankAnalysis], culprits: Collection[int], verdict: Verdict) -> list[RankClass]:
    """The ranks in classes of one state, op and call site, culprits apart from the rest:
    culprits first, then the largest, then by first rank."""
    classes: dict[tuple[bool, RankState, str, str], list[RankAnalysis]] = {}
    said: dict[int, tuple[str, str]] = {}  # by op object: 100,000 ranks share a few ops
    for ra in ranks:
        where = said.get(id(ra.op))
        if where is None:
            where = said[id(ra.op)] = (op_text(ra.op), call_site(ra))
        key = (ra.rank is not None and ra.rank in culprits, ra.state, *where)
        classes.setdefault(key, []).append(ra)
    out = [
        RankClass(
            culprit=culprit,
            state=state,
            state_word=state_word(state, verdict),
            op=op,
            site=site,
            members=tuple(members),
            numbers=tuple(sorted({m.rank for m in members if m.rank is not None})),
        )
        for (culprit, state, op, site), members in classes.items()
    ]
    return sorted(out, key=lambda c: (not c.culprit, -len(c.members), c.numbers[0] if c.numbers else -1))


def _details(members: Sequence[RankAnalysis]) -> list[str]:
    """The members' details that say more than their op (``detail``), each worked out once
    per op object and text: a class may hold 100,000 ranks."""
    seen: dict[tuple[int, str], str] = {}
    out = []
    for ra in members:
        key = (id(ra.op), ra.detail)
        if key not in seen:
            seen[key] = detail(ra)
        if seen[key]:
            out.append(seen[key])
    return out


def culprit_parts(ranks: Sequence[int], limit: int = 40) -> tuple[str, str]:
    """``("culprit", "rank 3")``, ``("culprits", "ranks 3, 5-7")``; a long set cut, with
    its count (``ranks 0, 2, 4, … (5,000)``); ``("", "")`` for none."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "", ""
    if len(ordered) == 1:
        return "culprit", f"rank {ordered[0]}"
    text, cut = cut_ranges(ordered, limit)
    return "culprits", f"ranks {text.replace(',', ', ')}" + (f" ({count_text(len(ordered))})" if cut else "")


def culprit_words(ranks: Sequence[int], limit: int = 40) -> str:
    """``culprit: rank 3``, ``culprits: ranks 3, 5-7`` (see ``culprit_parts``); ``""`` for none."""
    word, said = culprit_parts(ranks, limit)
    return f"{word}: {said}" if said else ""
