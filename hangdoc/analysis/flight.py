"""What the ranks' flight recorder dumps say, matched across each process group's members.

torch numbers each group's collectives on every rank (``collective_seq_id``): the n-th
collective a rank issues on a group is meant to be the n-th of every other member. So,
group by group, over the members that have a dump:

* **mismatch**: at the first sequence number where members recorded different calls (op,
  input sizes or dtypes), the members outside the largest class are the culprits. This is
  the pipeline shape mismatch of the seed guide, an empty tensor on one rank (a size
  mismatch gloo does not catch: its side sends nothing and returns), and a collective
  skipped on one rank earlier, which shifts every later number. A tie names no culprit.
  A skip shows as a shift: when a culprit issued as #n what a member ahead of the rest
  issued as #n+k (or the other way round), the evidence says it looks to have skipped (or
  added) k calls. A call skipped among calls of the same op and sizes shifts the numbers
  without changing what is recorded under them: the dumps then show where the calls
  first differ, not where the shift began, and the evidence says which numbers agree.
* **behind**: every collective of the group is looked at, not only the newest: the group
  is stuck at the lowest number any member has not finished; the members that wait in it
  are held by the members whose newest number is lower (they have not called it, even
  where other members finished their side and went on: a gather's non-roots, say).
* **unseen**: every member with a dump called that collective, and members the dumps'
  group config lists left no dump: the collective waits on them. A rank with no dump is
  *not seen*, never missing: the verdict names it on its peers' word, at low confidence.
* **all in**: every member issued the collective and none finished it: the ranks agree;
  the problem is below them (transport, a peer process, the device).
* **stuck**: every member issued it, some finished their side and the others did not. The
  dumps do not record a broadcast's (reduce's, gather's, scatter's) root, so they cannot
  tell which side is wrong: no culprit, and stacks that blame a rank the dumps show past
  it are overruled (``unknown``).
* **idle**: no rank has an unfinished op in its dump: the ranks wait outside anything the
  flight recorder saw.

**Every group, then between them.** Each group gives its finding; then the waits decide:
a rank waiting in a group waits for the members that have not called its collective. A
rank waited for that itself waits in another group is a victim, not a cause (ranks 2-3
wait in group B for rank 1, which waits in group A for rank 0: rank 0 is the culprit);
the culprits are the ranks the waits end at. Waits that end in a collective every member
called leave that group's finding; waits that close a cycle across groups are groups
called in different orders (a **group cycle**, a collective mismatch). The members of every
group in the cycle then say, by their rings' order, which of the collectives it waits in
they issued first: a minority that issued another first than the majority are the
culprits (ranks 3-4 wait in an expert group for rank 5, which skipped it and waits in
WORLD for them: rank 5). A tie (two ranks, one each way) names every member that took a
side: the dumps cannot tell a skipped call on one from an added call on the other.

**Membership.** A group's members are the ranks whose ops name it, every rank for WORLD,
and the ranks its config lists. gloo's ``pg_config`` names WORLD ``''`` (with the ranks
``[0, 1, 2]``, or ``[]`` once subgroups exist) while its entries name it ``'0'``: an
unnamed config that holds the rank that wrote it is taken as that rank's WORLD. gloo
describes a group made without ``group_desc`` as ``undefined``: it is labelled by name.

**p2p ops.** ``p2p_seq_id`` counts a rank's p2p ops on a group, to every peer together, so
equal numbers on two ranks are not the same transfer. What pairs is order per ordered
pair: the i-th send from a to b on a group is the i-th receive of b from a (one
communicator per pair, first in first out). That is matched only where it is sound:

* the peer must be in the dump: NCCL names a send ``send 0->1`` in ranks of the group,
  mapped to global ranks through the group's member list (sorted, as torch numbers a
  group's ranks; the default group's ranks are the global ones). gloo (torch 2.13) records
  no p2p op at all, so a gloo job's p2p waits leave no trace here (see **idle**);
* both ranks' rings must still hold every op since the process began (the oldest entry is
  record 0): a ring that wrapped lost how many sends came before, and counting from its
  oldest entry would pair the wrong transfers. Such a pair is named, not judged.

Then a send and its receive that differ in sizes or dtypes are a p2p mismatch (no culprit:
neither side is a minority); an unfinished send whose receive the peer has not posted, or
an unfinished receive whose send the peer has not issued, is a wait on that peer. Waits
that close a cycle (two stages both sending, or both receiving) are a **p2p deadlock**
naming every rank in it; a wait on a rank that waits on no p2p peer names that rank.

Members with no dump are named, and judged only as above (a rank stuck in
``destroy_process_group`` never dumps; its stacks cover it). Unlike an analyzer that takes the first rank's view as
the reference, the majority decides, so one bad rank cannot make the healthy ones look
wrong. The dumps are indexed once; matching costs time linear in their entries (plus
sorting each group's distinct sequence numbers).

``settle.by_flight``, a rule of the classifier, folds the finding into the stacks' verdict:
it sharpens a verdict the dumps confirm, and overrides one they contradict, saying so in
the evidence and basis (``confidence.SETTLED_BY_FLIGHT`` says how sure each outcome is). A
job the stacks saw progressing is left ``not_hung``: dumps taken moments apart differ.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..model import (
    FlightEntry,
    FlightRecord,
    JobSnapshot,
    Verdict,
    counted,
)
from ..rankranges import ranges_text, rank_phrase

MAX_SHIFT = 4  # the most skipped (or added) calls a shift is looked for over
SHIFT_SPAN = 64  # the most numbers compared to confirm a shift
MAX_SHIFT_CHECKS = 256  # culprit ranks whose shift is looked for


class FlightKind(enum.Enum):
    MISMATCH = "mismatch"
    """Members recorded different calls under one collective sequence number."""
    P2P_DEADLOCK = "p2p_deadlock"
    """Ranks wait on each other's sends or receives in a cycle."""
    P2P_MISMATCH = "p2p_mismatch"
    """A send and its receive differ, or a rank waits on a peer that has not posted the
    other side and waits elsewhere (or nowhere)."""
    BEHIND = "behind"
    """Some members have not issued the collective the others wait in (its lowest unfinished
    number): the ranks that have not called it are the culprits."""
    UNSEEN = "unseen"
    """Every member with a dump issued the collective the group waits in; members its peers'
    dumps list left no dump: the collective waits on them (not seen: low confidence)."""
    GROUP_CYCLE = "group_cycle"
    """Ranks wait on each other across process groups: each waits in one group for a rank
    that has not called it because it waits in another (groups used in different orders)."""
    ALL_IN = "all_in"
    """Every member waits, unfinished, in the same collective."""
    STUCK = "stuck"
    """Every member issued the collective; some finished their side and others wait. The
    dumps cannot tell which side is wrong (a broadcast's root is not in them)."""
    IDLE = "idle"
    """No rank has an unfinished op in its dump."""
    UNPAIRED = "unpaired"
    """Ranks wait in p2p ops the dumps cannot pair (no member list, a ring that wrapped)."""


_ORDER = {
    FlightKind.MISMATCH: 0,
    FlightKind.GROUP_CYCLE: 1,
    FlightKind.P2P_DEADLOCK: 2,
    FlightKind.P2P_MISMATCH: 3,
    FlightKind.BEHIND: 4,
    FlightKind.UNSEEN: 5,
    FlightKind.ALL_IN: 6,
    FlightKind.STUCK: 7,
    FlightKind.IDLE: 8,
    FlightKind.UNPAIRED: 9,
}
# collectives with a root (src/dst) that the dumps do not record
_ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter", "_broadcast_oop", "_reduce_oop"})


@dataclass(frozen=True, slots=True)
class FlightFinding:
    kind: FlightKind
    group: str  # "default_pg (0)"
    seq: int
    culprits: tuple[int, ...]  # global ranks; () when the dumps name none (a tie)
    summary: str
    evidence: tuple[str, ...]
    basis: str = ""  # what the verdict rests on, one phrase
    verdict: Verdict | None = None  # the verdict the dumps support; None: evidence only
    # culprits no evidence shows (no dump, no stacks): named on their peers' word, so the
    # verdict is stated with low confidence
    unseen: tuple[int, ...] = ()
    # ranks the dumps show finished their side of the collective the others wait in: not
    # culprits, whatever their stacks look like (they wait past it)
    cleared: tuple[int, ...] = ()


def match_flight(snapshot: JobSnapshot) -> FlightFinding | None:
    """The finding that explains the others, over every collective of every group the dumps
    mention, or None."""
    records = {r.rank: r.flight for r in snapshot.ranks if r.flight is not None and r.rank is not None}
    if not records:
        return None
    groups = _index(records)
    findings: list[FlightFinding] = []
    fronts: list[tuple[_Front, FlightFinding]] = []
    notes: list[str] = []
    for name in sorted(groups):
        group = groups[name]
        found = _mismatch(group.label, group.colls) if group.colls else None
        front = _front(group, records) if found is None else None
        if front is not None:
            found = _front_finding(front)
        p2p, unjudged = _match_p2p(group, records)
        notes.extend(unjudged)
        for finding in (found, p2p):
            if finding is not None:
                findings.append(_with_missing(finding, group, records))
                if front is not None and finding is found:
                    fronts.append((front, findings[-1]))
    if not findings:
        idle = _idle(groups, records)
        if idle is not None:
            return idle  # nothing unfinished: what could not be paired does not matter
        if notes:
            summary = f"ranks wait in p2p ops the flight recorder cannot pair: {notes[0]}"
            return FlightFinding(
                FlightKind.UNPAIRED, "", 0, (), summary, tuple(notes[:8]), "flight recorder: p2p ops not paired"
            )
        return None
    decided = _decide(fronts, records)
    if decided is not None:
        findings.append(decided)
    findings.sort(key=lambda f: (_ORDER[f.kind], not f.culprits, f.seq))
    best = findings[0]
    if decided is not None and best.kind in (FlightKind.BEHIND, FlightKind.UNSEEN, FlightKind.ALL_IN, FlightKind.STUCK):
        best = decided  # the waits across groups decide between the groups' findings
    seen = {r.rank for r in snapshot.ranks if r.rank is not None}
    unseen = tuple(r for r in best.culprits if r not in seen)
    # the other groups' findings, said; where the waits across groups decided, that says theirs
    weighed = {id(f) for _, f in fronts} if best is decided else set()
    others = [
        f"also on {f.group}: {f.summary}"
        for f in findings
        if f.group != best.group and f.group and f is not decided and id(f) not in weighed
    ]
    return dataclasses.replace(best, unseen=unseen, evidence=(*best.evidence, *others[:4], *notes[:4]))


# ------------------------------------------------------------------ the dumps, indexed once


@dataclass(slots=True)
class _Group:
    """One process group as every dump together shows it."""

    name: str
    desc: str = ""
    configured: set[int] = field(default_factory=set)  # members by any dump's config
    colls: dict[int, dict[int, FlightEntry]] = field(default_factory=dict)  # rank -> seq -> op
    p2p: dict[int, list[FlightEntry]] = field(default_factory=dict)  # rank -> its p2p ops, in order

    @property
    def label(self) -> str:
        """``default_pg (0)``: the description its config or its ops give, and its name."""
        return f"{self.desc} ({self.name})" if self.desc else f"group {self.name}"

    @property
    def default(self) -> bool:
        """WORLD: every rank is a member."""
        return self.desc == "default_pg" or (self.name == "0" and not self.desc)


def _index(records: dict[int, FlightRecord]) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    entry_desc: dict[str, str] = {}
    entry_names = {e.group for rec in records.values() for e in rec.entries}
    unnamed: list[tuple[int, tuple[int, ...]]] = []  # (rank, ranks) of configs with no group's name
    for rank, rec in records.items():
        for config in rec.groups:
            if config.name not in entry_names and not config.name:
                # gloo's pg_config names WORLD '' (its entries say '0'): placed once the
                # entries show which group is the default one
                unnamed.append((rank, config.ranks))
                continue
            group = groups.setdefault(config.name, _Group(config.name))
            group.configured.update(config.ranks)
            group.desc = group.desc or config.desc
        name: str | None = None  # a ring holds runs of one group's ops: look it up per run
        for e in rec.entries:
            if e.group != name:
                name = e.group
                group = groups.get(name) or groups.setdefault(name, _Group(name))
                if e.group_desc and name not in entry_desc:
                    entry_desc[name] = e.group_desc
            if e.p2p:
                group.p2p.setdefault(rank, []).append(e)
            else:
                colls = group.colls.get(rank)
                if colls is None:
                    colls = group.colls[rank] = {}
                colls[e.seq] = e
    for group_name, desc in entry_desc.items():
        if desc != "undefined":  # gloo's description of a group created without one
            groups[group_name].desc = groups[group_name].desc or desc
    world = next((g for g in groups.values() if g.default), None)
    if world is not None:
        for rank, ranks in unnamed:
            if rank in ranks:  # a rank's view of WORLD holds that rank
                world.configured.update(ranks)
    return groups


def _with_missing(finding: FlightFinding, group: _Group, records: dict[int, FlightRecord]) -> FlightFinding:
    undumped = sorted(group.configured - set(records))
    if not undumped or finding.kind is FlightKind.UNSEEN:  # that one says so itself
        return finding
    line = f"no flight recorder dump from {rank_phrase(undumped)} of {group.label}"
    return dataclasses.replace(finding, evidence=(*finding.evidence, line))


# ------------------------------------------------------------------ collectives


def _mismatch(label: str, ops: dict[int, dict[int, FlightEntry]]) -> FlightFinding | None:
    # one pass: each number's first call seen, how many members hold it, the lowest that differs
    first: dict[int, FlightEntry] = {}
    held: dict[int, int] = defaultdict(int)
    differ: int | None = None
    for by_seq in ops.values():
        for number, entry in by_seq.items():
            held[number] += 1
            ref = first.setdefault(number, entry)
            if ref is not entry and (differ is None or number < differ) and not _same(ref, entry):
                differ = number
    if differ is None:
        return None
    seq = differ
    # the numbers before the difference every member holds (and so agrees on)
    agreed = sorted(n for n, count in held.items() if n < seq and count == len(ops))
    at = {r: by_seq[seq] for r, by_seq in ops.items() if seq in by_seq}
    classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for rank, entry in at.items():
        classes[entry.signature].append(rank)
    ranked = sorted(classes.values(), key=len, reverse=True)
    majority = ranked[0] if len(ranked[0]) > len(ranked[1]) else []
    agreeing = set(majority)
    culprits = tuple(sorted(r for r in at if r not in agreeing)) if majority else ()
    lines = [
        f"{rank_phrase(ranks)} recorded {at[ranks[0]].describe()} as collective #{seq} of {label}" for ranks in ranked
    ]
    kind = _difference([at[ranks[0]] for ranks in ranked])
    if majority:
        summary = (
            f"collective mismatch (flight recorder): {rank_phrase(list(culprits))} called "
            f"{at[culprits[0]].describe()} as collective #{seq} of {label} while "
            f"{rank_phrase(majority)} called {at[majority[0]].describe()}{kind}"
        )
        lines.extend(_shifts(label, seq, ops, culprits, majority))
        lines.extend(_moved_on(label, seq, ops, culprits))
        lines.extend(_repeated(label, seq, ops[majority[0]], majority, culprits))
    else:
        summary = (
            f"collective mismatch (flight recorder): the ranks of {label} disagree on "
            f"collective #{seq} and no call is the majority's{kind}"
        )
    if agreed:
        where = (
            _span(agreed[0], agreed[-1])
            if agreed[-1] - agreed[0] + 1 == len(agreed)
            else f"{len(agreed)} numbers from #{agreed[0]} to #{agreed[-1]}"
        )
        lines.append(
            f"{rank_phrase(sorted(ops))} recorded the same calls (op, sizes, dtypes) as collectives {where} of {label}"
        )
    basis = f"flight recorder: collective #{seq} of {label} differs between ranks"
    return FlightFinding(
        FlightKind.MISMATCH, label, seq, culprits, summary, tuple(lines), basis, Verdict.COLLECTIVE_MISMATCH
    )


def _same(a: FlightEntry, b: FlightEntry) -> bool:
    """``a.signature == b.signature``, without building the tuples (this runs per entry)."""
    return a.op == b.op and a.input_sizes == b.input_sizes and a.input_dtypes == b.input_dtypes


def _difference(calls: Sequence[FlightEntry]) -> str:
    """``: same op, different sizes`` where only the tensors differ."""
    if len({e.op for e in calls}) > 1:
        return ""
    if len({e.input_sizes for e in calls}) > 1:
        return ": same op, different sizes"
    return ": same op, different dtypes"


def _shifts(
    label: str, seq: int, ops: dict[int, dict[int, FlightEntry]], culprits: Sequence[int], majority: Sequence[int]
) -> list[str]:
    """Evidence that culprits skipped (or added) calls: what a culprit recorded from #seq on
    is what the majority recorded k numbers later (or earlier)."""
    ahead = max(majority, key=lambda r: max(ops[r]))
    lines: list[str] = []
    found: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rank in list(culprits)[:MAX_SHIFT_CHECKS]:
        for k in range(1, MAX_SHIFT + 1):
            if _lines_up(ops[rank], ops[ahead], seq, seq + k):
                found[("skipped", k)].append(rank)
                break
            if _lines_up(ops[rank], ops[ahead], seq + k, seq):
                found[("added", k)].append(rank)
                break
    for (how, k), ranks in found.items():
        who = rank_phrase(ranks)
        if how == "skipped":
            call = ops[ahead][seq + k].describe()
            skipped = ops[ahead][seq].describe() if k == 1 else f"{k} calls, from {ops[ahead][seq].describe()}"
            lines.append(
                f"{who} issued as collective #{seq} the call rank {ahead} issued as #{seq + k} ({call}): "
                f"{who} looks to have skipped collective {_span(seq, seq + k - 1)} of {label} "
                f"({skipped}), which shifts every later number by {k}"
            )
        else:
            call = ops[ahead][seq].describe()
            extra = ops[ranks[0]][seq].describe()
            lines.append(
                f"{who} issued as collective #{seq + k} the call rank {ahead} issued as #{seq} ({call}): "
                f"{who} looks to have made {counted(k, 'call')} of {label} the others did not (from {extra} "
                f"as #{seq}), which shifts every later number by {k}"
            )
    return lines


def _lines_up(mine: dict[int, FlightEntry], theirs: dict[int, FlightEntry], start: int, their_start: int) -> bool:
    """``mine`` from #start on records what ``theirs`` records from #their_start on, over
    every number both hold (at least one)."""
    compared = 0
    for i in range(SHIFT_SPAN):
        a, b = mine.get(start + i), theirs.get(their_start + i)
        if a is None or b is None:
            break
        if a.signature != b.signature:
            return False
        compared += 1
    return compared > 0


def _repeated(
    label: str, seq: int, theirs: dict[int, FlightEntry], majority: Sequence[int], culprits: Sequence[int]
) -> list[str]:
    """Where the majority's call at #seq repeats the calls before it, a call skipped (or
    added) among them would not show before #seq: say so."""
    start = seq
    while start - 1 in theirs and theirs[start - 1].signature == theirs[seq].signature:
        start -= 1
    if start == seq:
        return []
    return [
        (
            f"{rank_phrase(majority)} recorded {theirs[seq].describe()} as every collective {_span(start, seq)} "
            f"of {label}: a call among them skipped (or added) on {rank_phrase(culprits)} would shift the numbers "
            f"without showing before #{seq}"
        )
    ]


def _moved_on(label: str, seq: int, ops: dict[int, dict[int, FlightEntry]], culprits: Sequence[int]) -> list[str]:
    """Culprits whose side of #seq finished (an empty tensor's, say) and that wait in a
    later collective of the group."""
    moved: dict[tuple[int, str], list[int]] = defaultdict(list)
    for rank in culprits:
        mine = ops[rank]
        if not mine[seq].finished:
            continue
        later = [s for s, e in mine.items() if s > seq and not e.finished]
        if later:
            now = min(later)
            moved[(now, mine[now].describe())].append(rank)
    return [
        f"{rank_phrase(ranks)} finished {'its' if len(ranks) == 1 else 'their'} side of collective #{seq} and "
        f"{'waits' if len(ranks) == 1 else 'wait'} in collective #{now} ({what}) of {label}"
        for (now, what), ranks in moved.items()
    ]


@dataclass(slots=True)
class _Front:
    """Where one group's collectives stand, over its members with a dump."""

    group: _Group
    newest: dict[int, int]  # member -> its newest collective number on the group (0: none yet)
    pending: dict[int, int]  # member -> its lowest unfinished collective number (only ranks with one)
    unseen: list[int]  # members by some dump's config that left no dump
    seq: int  # the number the group is stuck at: the lowest any member has not finished


def _front(group: _Group, records: dict[int, FlightRecord]) -> _Front | None:
    """The group's front, or None where no member has an unfinished collective on it."""
    ops = group.colls
    pending: dict[int, int] = {}
    for rank, by_seq in ops.items():
        low = min((n for n, e in by_seq.items() if not e.finished), default=None)
        if low is not None:
            pending[rank] = low
    if not pending:
        return None
    newest = {r: max(by_seq) for r, by_seq in ops.items() if by_seq}
    members = group.configured | ops.keys()
    if group.default:
        members |= records.keys()  # every rank is in WORLD
    for rank in members:
        rec = records.get(rank)
        if rank not in newest and rec is not None and rec.from_start:
            newest[rank] = 0  # its whole ring holds no op of the group: it has issued none
    # a member whose ring wrapped past every op of the group: where it stands is not known
    return _Front(group, newest, pending, sorted(members - records.keys()), min(pending.values()))


def _front_finding(front: _Front) -> FlightFinding | None:
    """What the group's front shows: members that have not called the collective the others
    wait in; else members without a dump it waits on; else every member in it."""
    ops, label, seq = front.group.colls, front.group.label, front.seq
    waiting = sorted(r for r, p in front.pending.items() if p == seq)
    entry = ops[waiting[0]][seq]
    behind = sorted(r for r, n in front.newest.items() if n < seq)
    done = sorted(r for r, n in front.newest.items() if n >= seq and front.pending.get(r) != seq)
    one = len(waiting) == 1
    started = (
        f"{rank_phrase(waiting)} issued collective #{seq} ({entry.describe()}) of {label} and "
        f"{'has' if one else 'have'} not finished it"
    )
    moved = _moved_past(label, seq, ops, front.pending, done)
    if behind:
        last = ", ".join(
            f"rank {r} up to #{front.newest[r]}" if front.newest[r] else f"rank {r} none" for r in behind[:8]
        ) + (", ..." if len(behind) > 8 else "")
        summary = (
            f"{rank_phrase(behind)} {'has' if len(behind) == 1 else 'have'} not called collective #{seq} "
            f"({entry.describe()}) of {label}, which {rank_phrase(waiting)} "
            f"{'waits' if one else 'wait'} in (flight recorder)"
        )
        basis = f"flight recorder: collective #{seq} of {label} not yet called by the culprits"
        return FlightFinding(
            FlightKind.BEHIND,
            label,
            seq,
            tuple(behind),
            summary,
            (started, f"issued so far on {label}: {last}", *moved),
            basis,
            Verdict.STRAGGLER,
        )
    if front.unseen:
        unseen = front.unseen
        who, single = rank_phrase(unseen), len(unseen) == 1
        summary = (
            f"{rank_phrase(waiting)} {'waits' if one else 'wait'} in collective #{seq} ({entry.describe()}) of "
            f"{label} for {who}, which {'its' if one else 'their'} dump{'' if one else 's'} list as "
            f"{'a member' if single else 'members'} and which left no dump (not seen) (flight recorder)"
        )
        lines = (
            started,
            *moved,
            (
                f"every rank of {label} with a dump issued collective #{seq}; their dumps list {who} as "
                f"{'a member' if single else 'members'} of {label}: the collective waits on "
                f"{'it' if single else 'them'}"
            ),
            (
                f"{who} left no flight recorder dump: not seen, which is no evidence of "
                f"{'a dead process' if single else 'dead processes'}; whether {'it lags' if single else 'they lag'} "
                f"before #{seq} or {'waits' if single else 'wait'} inside it the dumps cannot show"
            ),
        )
        basis = f"flight recorder: every rank of {label} with a dump waits in collective #{seq}; {who} left none"
        return FlightFinding(
            FlightKind.UNSEEN, label, seq, tuple(unseen), summary, lines, basis, Verdict.STRAGGLER, unseen=tuple(unseen)
        )
    if done:
        summary = (
            f"every rank of {label} issued collective #{seq} ({entry.describe()}); {rank_phrase(waiting)} "
            f"{'has' if one else 'have'} not finished it while {rank_phrase(done)} finished "
            f"{'its' if len(done) == 1 else 'their'} side (flight recorder)"
        )
        why = (
            f"the dumps do not record a {entry.op}'s root (src/dst): whether the ranks agree on it they "
            "cannot show, so they name no culprit"
            if entry.op in _ROOTED
            else "every rank recorded the same call: what holds the others in it the dumps cannot show"
        )
        basis = f"flight recorder: every rank of {label} issued collective #{seq}; some finished it"
        return FlightFinding(
            FlightKind.STUCK, label, seq, (), summary, (started, *moved, why), basis, cleared=tuple(done)
        )
    if len(waiting) < 2:
        return None
    line = (
        f"{rank_phrase(waiting)} all issued collective #{seq} ({entry.describe()}) of {label}; "
        f"none has finished it (flight recorder)"
    )
    basis = f"flight recorder: every rank of {label} issued collective #{seq}"
    return FlightFinding(FlightKind.ALL_IN, label, seq, (), line, (line,), basis)


def _moved_past(
    label: str, seq: int, ops: dict[int, dict[int, FlightEntry]], pending: dict[int, int], done: Sequence[int]
) -> list[str]:
    """Members that finished their side of #seq, and where in the group they wait now."""
    moved: dict[tuple[int, str], list[int]] = defaultdict(list)
    for rank in done:
        now = pending.get(rank)
        moved[(now, ops[rank][now].describe()) if now is not None else (0, "")].append(rank)
    lines = []
    for (now, what), ranks in sorted(moved.items())[:8]:
        who, one = rank_phrase(ranks), len(ranks) == 1
        lines.append(
            f"{who} finished {'its' if one else 'their'} side of collective #{seq} and "
            + (
                f"{'waits' if one else 'wait'} in collective #{now} ({what}) of {label}"
                if now
                else f"{'has' if one else 'have'} no unfinished collective on {label}"
            )
        )
    return lines


def _decide(fronts: Sequence[tuple[_Front, FlightFinding]], records: dict[int, FlightRecord]) -> FlightFinding | None:
    """Every group's finding weighed against the others: each rank waiting in a group waits
    for the members that have not called its collective (those whose newest number is
    lower; the members without a dump where every member with one has called it). A rank
    waited for that itself waits elsewhere is a victim: the culprits are the ranks the
    waits end at that wait on nothing the dumps show. Waits that end at ranks waiting in a
    collective every member called leave that group's finding (no culprit); waits that
    close a cycle are groups called in different orders. None where no rank waits for
    another."""
    waits: dict[int, tuple[_Front, int]] = {}  # rank -> (where it waits, one rank it waits for)
    targets: set[int] = set()
    pending: dict[int, tuple[_Front, int]] = {}  # rank -> a group it has an unfinished collective in
    for front, _ in fronts:
        for rank, at in front.pending.items():
            pending.setdefault(rank, (front, at))
        lowest = min(front.newest.items(), key=lambda kv: kv[1], default=None)
        top = max(front.pending.values())
        targets.update(r for r, n in front.newest.items() if n < top)
        if lowest is not None:
            for rank, at in front.pending.items():
                if lowest[1] < at:
                    waits.setdefault(rank, (front, lowest[0]))
        if front.unseen and (lowest is None or lowest[1] >= front.seq):
            targets.update(front.unseen)
            for rank, at in front.pending.items():
                if at == front.seq:
                    waits.setdefault(rank, (front, front.unseen[0]))
    if not waits:
        return None
    sinks = targets - waits.keys()
    free = sorted(r for r in sinks if r not in pending)
    if free:
        named = set(free)
        roots = [f for _, f in fronts if not named.isdisjoint(f.culprits)]
        if not roots:  # waited for only past where its group is stuck (async ops): no group's culprit
            return None
    elif sinks:
        stuck = {pending[r][0].group.name for r in sinks}
        roots = [f for front, f in fronts if front.group.name in stuck]
    else:
        return _group_cycle(waits, records)
    roots.sort(key=lambda f: (_ORDER[f.kind], f.seq))
    primary = roots[0]
    rooted = {id(f) for f in roots}
    victims = [
        _victims(front, f, waits, pending)
        for front, f in fronts
        if f.culprits and id(f) not in rooted and all(r in waits or r in pending for r in f.culprits)
    ]
    also = [f"also on {f.group}: {f.summary}" for f in roots[1:]]
    return dataclasses.replace(primary, culprits=tuple(free), evidence=(*primary.evidence, *victims[:8], *also[:4]))


def _victims(
    front: _Front, finding: FlightFinding, waits: dict[int, tuple[_Front, int]], pending: dict[int, tuple[_Front, int]]
) -> str:
    """``ranks 2-3 wait in collective #3 (...) of group 2, which rank 1 has not called: it
    waits in collective #5 (...) of group 1 for rank 0``."""
    waiting = sorted(r for r, p in front.pending.items() if p == front.seq)
    entry = front.group.colls[waiting[0]][front.seq]
    culprit = finding.culprits[0]
    where, on = waits[culprit] if culprit in waits else (pending[culprit][0], None)
    at = where.pending[culprit]
    one = len(finding.culprits) == 1
    return (
        f"{rank_phrase(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in collective #{front.seq} "
        f"({entry.describe()}) of {front.group.label}, which {rank_phrase(finding.culprits)} "
        f"{'has' if one else 'have'} not called: {rank_phrase([culprit])} waits in collective #{at} "
        f"({where.group.colls[culprit][at].describe()}) of {where.group.label}"
        + (f" for rank {on}" if on is not None else "")
    )


def _group_cycle(waits: dict[int, tuple[_Front, int]], records: dict[int, FlightRecord]) -> FlightFinding:
    """Every rank waited for waits for another: follow the waits from one until they close.
    The members of every group in the cycle then say which of the collectives the cycle
    waits in they issued first; a minority that issued another first than the majority are
    the culprits. A tie (two ranks, one each way) or no such member names every rank of
    the cycle: the dumps cannot tell an added call from a skipped one."""
    rank = next(iter(waits))
    order: dict[int, int] = {}
    path: list[int] = []
    while rank not in order:
        order[rank] = len(path)
        path.append(rank)
        rank = waits[rank][1]
    cycle = path[order[rank] :]
    parts = []
    for r in cycle:
        front, on = waits[r]
        at = front.pending[r]
        parts.append(
            f"rank {r} waits in collective #{at} ({front.group.colls[r][at].describe()}) of "
            f"{front.group.label} for rank {on}"
        )
    first = waits[cycle[0]][0]
    groups, votes = _issued_first(cycle, waits, records)
    ranked = sorted(votes.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    lines: list[str] = []
    if len(ranked) > 1 and len(ranked[0][1]) > len(ranked[1][1]):
        usual, majority = ranked[0]
        culprits = sorted(r for _, ranks in ranked[1:] for r in ranks)
        members = sorted(r for _, ranks in ranked for r in ranks)
        lines = [f"{rank_phrase(ranks)} issued collective #{seq} of {label} first" for (label, seq), ranks in ranked]
        lines.append(
            f"{rank_phrase(members)}, the members of {groups} with a dump, issued these collectives in "
            f"different orders: {rank_phrase(majority)} one way, {rank_phrase(culprits)} the other"
        )
        other = ranked[1][0]
        summary = (
            f"collective mismatch (flight recorder): {rank_phrase(culprits)} issued collective #{other[1]} of "
            f"{other[0]} first while {rank_phrase(majority)} issued collective #{usual[1]} of {usual[0]} first: "
            "the ranks wait on each other across process groups"
        )
        basis = (
            f"flight recorder: {rank_phrase(culprits)} issued the collectives of {groups} "
            "in another order than the rest"
        )
        shown = {*cycle, *members}
    else:
        culprits = sorted({*cycle, *(r for _, ranks in ranked for r in ranks)})
        summary = (
            "collective mismatch (flight recorder): ranks wait on each other across process groups: "
            + ", ".join(parts)
            + ": the groups' collectives are called in different orders"
        )
        basis = f"flight recorder: ranks {ranges_text(sorted(set(culprits)))} wait on each other in different groups"
        shown = set(culprits)
    return FlightFinding(
        FlightKind.GROUP_CYCLE,
        first.group.label,
        first.pending[cycle[0]],
        tuple(culprits),
        summary,
        (*parts, *lines, *_held_behind(waits, shown)),
        basis,
        Verdict.COLLECTIVE_MISMATCH,
    )


def _issued_first(
    cycle: Sequence[int], waits: dict[int, tuple[_Front, int]], records: dict[int, FlightRecord]
) -> tuple[str, dict[tuple[str, int], list[int]]]:
    """(the groups, named) and, for each of the collectives the cycle waits in (one per
    group), the members of all those groups that issued it first, by their rings' order
    (an entry a ring no longer holds came before every entry it holds). A member whose
    ring does not show where it stands on a group (wrapped past it) has no say; nor one
    that issued none of them."""
    at: dict[str, tuple[_Front, int]] = {}
    for r in cycle:
        front = waits[r][0]
        seq = front.pending[r]
        if at.setdefault(front.group.name, (front, seq))[1] != seq:
            return "", {}  # one group's members wait at different numbers: no one set of calls
    if len(at) < 2:
        return "", {}
    colls = list(at.values())
    names = " and ".join(front.group.label for front, _ in colls)
    voters = set.intersection(*(set(front.newest) for front, _ in colls)) & records.keys()
    votes: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rank in sorted(voters):
        position = {id(e): i for i, e in enumerate(records[rank].entries)}
        issued = []
        for front, seq in colls:
            entry = front.group.colls.get(rank, {}).get(seq)
            if entry is not None:
                issued.append((position[id(entry)], front.group.label, seq))
            elif front.newest[rank] >= seq:
                issued.append((-1, front.group.label, seq))  # dropped from its ring: older than all it holds
        if issued:
            _, label, seq = min(issued)
            votes[(label, seq)].append(rank)
    return names, votes


def _held_behind(waits: dict[int, tuple[_Front, int]], cycle: set[int]) -> list[str]:
    """The ranks outside the cycle that wait on a rank in it."""
    held: dict[tuple[str, int], tuple[_Front, list[int], set[int]]] = {}
    for rank, (front, on) in sorted(waits.items()):
        if rank in cycle or on not in cycle:
            continue
        at = front.pending[rank]
        key = (front.group.name, at)
        held.setdefault(key, (front, [], set()))[1].append(rank)
        held[key][2].update(r for r, n in front.newest.items() if n < at)
    lines = []
    for (_, at), (front, ranks, behind) in sorted(held.items())[:4]:
        lines.append(
            f"{rank_phrase(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in collective #{at} "
            f"({front.group.colls[ranks[0]][at].describe()}) of {front.group.label} for "
            f"{rank_phrase(sorted(behind))}, which {'waits' if len(behind) == 1 else 'wait'} in the cycle"
        )
    return lines


def _idle(groups: dict[str, _Group], records: dict[int, FlightRecord]) -> FlightFinding | None:
    """Nothing unfinished anywhere: say up to where each group's collectives got."""
    if any(not e.finished for rec in records.values() for e in rec.entries):
        return None
    lines = []
    for name in sorted(groups)[:8]:
        group = groups[name]
        newest = {r: max(by_seq) for r, by_seq in group.colls.items() if by_seq}
        if not newest:
            continue
        by_front: dict[int, list[int]] = defaultdict(list)
        for rank, seq in newest.items():
            by_front[seq].append(rank)
        lines.append(
            f"on {group.label}: "
            + ", ".join(
                f"{rank_phrase(ranks)} finished every collective up to #{seq}"
                for seq, ranks in sorted(by_front.items())
            )
        )
    if not lines:
        return None
    summary = (
        "no rank has an unfinished collective in its flight recorder: the ranks wait outside "
        "every op it saw (a p2p op, which gloo does not record, or no torch.distributed call)"
    )
    basis = "flight recorder: no unfinished op on any rank"
    return FlightFinding(FlightKind.IDLE, "", 0, (), summary, (summary, *lines), basis)


# ------------------------------------------------------------------ p2p


@dataclass(frozen=True, slots=True)
class _Wait:
    """Rank ``rank`` waits in ``op`` on ``peer``, which has not posted the other side."""

    rank: int
    peer: int
    op: FlightEntry
    nth: int  # 1-based: its n-th send to (receive from) the peer
    posted: int  # how many of the other side the peer has posted


def _match_p2p(group: _Group, records: dict[int, FlightRecord]) -> tuple[FlightFinding | None, list[str]]:
    """(the finding, notes on what could not be matched) for the group's p2p ops."""
    if not any(e.peer is not None for ops in group.p2p.values() for e in ops):
        return None, []
    to_global = _to_global(group)
    if to_global is None:
        return None, [f"p2p ops of {group.label} not matched: no dump lists the group's ranks"]
    sends: dict[tuple[int, int], list[FlightEntry]] = defaultdict(list)  # (from, to)
    recvs: dict[tuple[int, int], list[FlightEntry]] = defaultdict(list)  # (at, from)
    for rank, ops in group.p2p.items():
        for e in ops:
            peer = to_global.get(e.peer) if e.peer is not None else None
            if peer is None:
                continue
            if e.op == "send":
                sends[(rank, peer)].append(e)
            elif e.op == "recv":
                recvs[(rank, peer)].append(e)
    pairs = sorted({*sends, *((b, a) for a, b in recvs)})
    whole = {r for r, rec in records.items() if rec.from_start}
    unjudged = sorted({r for pair in pairs for r in pair if r not in whole})
    waits: list[_Wait] = []
    differ: tuple[int, int, int] | None = None
    for a, b in pairs:
        if a not in whole or b not in whole:
            continue
        sent, received = sends.get((a, b), []), recvs.get((b, a), [])
        for i in range(min(len(sent), len(received))):
            if _payload(sent[i]) != _payload(received[i]):
                # both sides over: it did not hang here (what it did to the data is not ours)
                if differ is None and not (sent[i].finished and received[i].finished):
                    differ = (a, b, i)
                break
        if len(sent) > len(received) and not sent[len(received)].finished:
            waits.append(_Wait(a, b, sent[len(received)], len(received) + 1, len(received)))
        if len(received) > len(sent) and not received[len(sent)].finished:
            waits.append(_Wait(b, a, received[len(sent)], len(sent) + 1, len(sent)))
    notes = []
    if unjudged:
        notes.append(
            f"p2p ops of {group.label} with {rank_phrase(unjudged)} not matched: "
            "no dump, or a ring that no longer holds the process's first op (counts from the start unknown)"
        )
    label = group.label
    if differ is not None:
        a, b, i = differ
        return _p2p_differ(label, a, b, sends[(a, b)][i], recvs[(b, a)][i], i + 1), notes
    if not waits:
        return None, notes
    cycle = _cycle(waits)
    if cycle:
        return _p2p_deadlock(label, cycle), notes
    return _p2p_unposted(label, waits, records), notes


def _to_global(group: _Group) -> dict[int, int] | None:
    """Group rank -> global rank: the members sorted (torch numbers a group's ranks in
    that order); the default group's ranks are the global ones."""
    if group.configured:
        ordered = sorted(group.configured)
        return dict(enumerate(ordered))
    if group.desc == "default_pg" or group.name == "0":
        peers = {e.peer for ops in group.p2p.values() for e in ops if e.peer is not None}
        return {p: p for p in peers}
    return None


def _payload(e: FlightEntry) -> tuple[object, ...]:
    return (e.input_sizes or e.output_sizes, e.input_dtypes or e.output_dtypes)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _shape(e: FlightEntry) -> str:
    return e.describe().partition(" ")[2] or "no tensor"


def _p2p_differ(label: str, a: int, b: int, send: FlightEntry, recv: FlightEntry, nth: int) -> FlightFinding:
    summary = (
        f"p2p mismatch (flight recorder): rank {a}'s {_ordinal(nth)} send to rank {b} "
        f"(p2p #{send.seq} of {label}: {_shape(send)}) and rank {b}'s {_ordinal(nth)} receive from "
        f"rank {a} (p2p #{recv.seq}: {_shape(recv)}) differ"
    )
    evidence = (
        f"rank {a} recorded send {_shape(send)} to rank {b} as p2p #{send.seq} of {label}, "
        + f"its {_ordinal(nth)} to rank {b}",
        f"rank {b} recorded recv {_shape(recv)} from rank {a} as p2p #{recv.seq} of {label}, "
        + f"its {_ordinal(nth)} from rank {a}",
        "one send and one receive: which side has the wrong shape the dumps cannot tell",
    )
    basis = f"flight recorder: a send and its receive on {label} differ (p2p #{send.seq} on rank {a})"
    return FlightFinding(
        FlightKind.P2P_MISMATCH, label, send.seq, (), summary, evidence, basis, Verdict.COLLECTIVE_MISMATCH
    )


def _wait_line(label: str, w: _Wait) -> str:
    if w.op.op == "send":
        return (
            f"rank {w.rank} waits in p2p #{w.op.seq} of {label} (send {_shape(w.op)} to rank {w.peer}, its "
            f"{_ordinal(w.nth)} to rank {w.peer}); rank {w.peer} has posted {counted(w.posted, 'receive')} from it"
        )
    return (
        f"rank {w.rank} waits in p2p #{w.op.seq} of {label} (recv {_shape(w.op)} from rank {w.peer}, its "
        f"{_ordinal(w.nth)} from rank {w.peer}); rank {w.peer} has issued {counted(w.posted, 'send')} to it"
    )


def _cycle(waits: Sequence[_Wait]) -> list[_Wait]:
    """One cycle of waits (rank -> the peer it waits on), or []: each rank's first wait
    is followed, so the walk is linear in the ranks."""
    first: dict[int, _Wait] = {}
    for w in waits:
        first.setdefault(w.rank, w)
    done: set[int] = set()
    for start in first:
        path: list[int] = []
        on_path: dict[int, int] = {}
        rank: int | None = start
        while rank is not None and rank in first and rank not in done and rank not in on_path:
            on_path[rank] = len(path)
            path.append(rank)
            rank = first[rank].peer
        if rank is not None and rank in on_path:
            return [first[r] for r in path[on_path[rank] :]]
        done.update(path)
    return []


def _p2p_deadlock(label: str, cycle: Sequence[_Wait]) -> FlightFinding:
    ranks = sorted(w.rank for w in cycle)
    kinds = {w.op.op for w in cycle}
    how = (
        "every one sends and none receives"
        if kinds == {"send"}
        else "every one receives and none sends"
        if kinds == {"recv"}
        else "each waits on the next"
    )
    parts = [
        f"rank {w.rank} waits to {'send to' if w.op.op == 'send' else 'receive from'} rank {w.peer} (p2p #{w.op.seq})"
        for w in cycle
    ]
    summary = f"p2p deadlock (flight recorder) on {label}: " + ", ".join(parts) + f": {how}"
    basis = f"flight recorder: ranks {ranges_text(sorted(set(ranks)))} wait on each other's p2p ops on {label}"
    return FlightFinding(
        FlightKind.P2P_DEADLOCK,
        label,
        min(w.op.seq for w in cycle),
        tuple(ranks),
        summary,
        tuple(_wait_line(label, w) for w in cycle),
        basis,
        Verdict.COLLECTIVE_MISMATCH,
    )


def _p2p_unposted(label: str, waits: Sequence[_Wait], records: dict[int, FlightRecord]) -> FlightFinding:
    waiting = {w.rank for w in waits}
    culprits = sorted({w.peer for w in waits} - waiting)
    shown = [w for w in waits if w.peer in culprits][:8] or list(waits[:8])
    elsewhere = []
    for peer in culprits[:8]:
        rec = records.get(peer)
        pending = next((e for e in rec.entries if not e.finished), None) if rec else None
        elsewhere.append(
            f"rank {peer} waits in {_where(pending)}"
            if pending
            else f"rank {peer} has no unfinished op in its flight recorder"
        )
    w = shown[0]
    summary = (
        f"p2p mismatch (flight recorder): rank {w.peer} has not posted the "
        f"{'receive' if w.op.op == 'send' else 'send'} rank {w.rank} waits on (p2p #{w.op.seq} of {label}: "
        f"{w.op.op} {_shape(w.op)})" + (f"; {elsewhere[0]}" if elsewhere else "")
    )
    busy = bool(elsewhere) and all(line.endswith("in its flight recorder") for line in elsewhere)
    basis = f"flight recorder: p2p #{w.op.seq} of {label} on rank {w.rank} has no counterpart on rank {w.peer}"
    return FlightFinding(
        FlightKind.P2P_MISMATCH,
        label,
        w.op.seq,
        tuple(culprits),
        summary,
        (*(_wait_line(label, x) for x in shown), *elsewhere),
        basis,
        Verdict.STRAGGLER if busy else Verdict.COLLECTIVE_MISMATCH,
    )


def _where(e: FlightEntry) -> str:
    what = "p2p" if e.p2p else "collective"
    return f"{what} #{e.seq} ({e.describe()}) of group {e.group}"


def _span(lo: int, hi: int) -> str:
    return f"#{lo}" if lo == hi else f"#{lo}-#{hi}"
