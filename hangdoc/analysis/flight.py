"""What the ranks' flight recorder dumps say, matched across each process group's members.

torch numbers each group's collectives on every rank (``collective_seq_id``): the n-th
collective a rank issues on a group is meant to be the n-th of every other member. So,
group by group, over the members that have a dump:

* **mismatch**: at the first sequence number where members recorded different calls (op,
  input sizes or dtypes), the members outside the largest class are the culprits. This is
  the pipeline shape mismatch of the seed guide, and a collective skipped on one rank
  earlier, which shifts every later number. A tie names no culprit.
* **behind**: some members wait, unfinished, in the group's newest collective while others
  have not issued it (their newest number is lower): those have not called it.
* **all in**: every member issued the same newest collective and none finished it: the
  ranks agree; the problem is below them (transport, a peer process, the device).

Members with no dump are named, never judged (a rank stuck in ``destroy_process_group``
never dumps; its stacks cover it). Unlike an analyzer that takes the first rank's view as
the reference, the majority decides, so one bad rank cannot make the healthy ones look
wrong. p2p ops are numbered per pair and are not matched here.

``apply_flight`` folds the finding into the stack diagnosis: it sharpens a verdict the
dumps confirm, and overrides one they contradict, saying so in the evidence and basis. A
job the stacks saw progressing is left ``not_hung``: dumps taken moments apart differ.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ..model import (
    Confidence,
    Diagnosis,
    FlightEntry,
    FlightRecord,
    JobSnapshot,
    Verdict,
    compress_ranks,
)


class FlightKind(enum.Enum):
    MISMATCH = "mismatch"
    BEHIND = "behind"
    ALL_IN = "all_in"


@dataclass(frozen=True, slots=True)
class FlightFinding:
    kind: FlightKind
    group: str  # "default_pg (0)"
    seq: int
    culprits: tuple[int, ...]  # global ranks; () when the dumps name none (a tie)
    summary: str
    evidence: tuple[str, ...]


def match_flight(snapshot: JobSnapshot) -> FlightFinding | None:
    """The strongest finding over every group the dumps mention, or None."""
    records = {r.rank: r.flight for r in snapshot.ranks if r.flight is not None and r.rank is not None}
    if not records:
        return None
    findings = [f for name in _group_names(records) if (f := _match_group(name, records))]
    order = {FlightKind.MISMATCH: 0, FlightKind.BEHIND: 1, FlightKind.ALL_IN: 2}
    findings.sort(key=lambda f: (order[f.kind], not f.culprits, f.seq))
    return findings[0] if findings else None


def _group_names(records: dict[int, FlightRecord]) -> list[str]:
    return sorted({e.group for rec in records.values() for e in rec.entries if not e.p2p})


def _label(name: str, records: dict[int, FlightRecord]) -> str:
    """``default_pg (0)``: the description its ops or its config give, and its name."""
    for rec in records.values():
        group = rec.group(name)
        desc = group.desc if group is not None and group.desc else next(
            (e.group_desc for e in rec.entries if e.group == name and e.group_desc), "")
        if desc:
            return f"{desc} ({name})"
    return f"group {name}"


def _members(name: str, records: dict[int, FlightRecord]) -> tuple[list[int], list[int]]:
    """(members with a dump that mentions the group, members named by its config but with
    no dump). A dump's own ops on the group make a rank a member even without a config."""
    mentioned = sorted(r for r, rec in records.items() if any(e.group == name and not e.p2p for e in rec.entries))
    configured: set[int] = set()
    for rec in records.values():
        group = rec.group(name)
        if group is not None and group.ranks:
            configured.update(group.ranks)
    undumped = sorted(configured - set(records))
    return mentioned, undumped


def _match_group(name: str, records: dict[int, FlightRecord]) -> FlightFinding | None:
    members, undumped = _members(name, records)
    label = _label(name, records)
    ops: dict[int, dict[int, FlightEntry]] = {
        r: {e.seq: e for e in records[r].entries if e.group == name and not e.p2p} for r in members}
    missing = (f"no flight recorder dump from rank(s) {compress_ranks(undumped)[1:-1]} of {label}"
               if undumped else None)
    found = _mismatch(label, ops) or _behind(label, ops) or _all_in(label, ops)
    if found is None:
        return None
    if missing:
        found = dataclasses.replace(found, evidence=(*found.evidence, missing))
    return found


def _mismatch(label: str, ops: dict[int, dict[int, FlightEntry]]) -> FlightFinding | None:
    seqs = sorted({s for by_seq in ops.values() for s in by_seq})
    for seq in seqs:
        at = {r: by_seq[seq] for r, by_seq in ops.items() if seq in by_seq}
        classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for rank, entry in at.items():
            classes[entry.signature].append(rank)
        if len(classes) < 2:
            continue
        ranked = sorted(classes.values(), key=len, reverse=True)
        majority = ranked[0] if len(ranked[0]) > len(ranked[1]) else []
        culprits = tuple(sorted(r for r in at if r not in majority)) if majority else ()
        lines = tuple(f"{_who(ranks)} recorded {at[ranks[0]].describe()} as collective #{seq} of {label}"
                      for ranks in ranked)
        if majority:
            first = culprits[0]
            summary = (f"collective mismatch (flight recorder): {_who(list(culprits))} called "
                       f"{at[first].describe()} as collective #{seq} of {label} while "
                       f"{_who(majority)} called {at[majority[0]].describe()}")
        else:
            summary = (f"collective mismatch (flight recorder): the ranks of {label} disagree on "
                       f"collective #{seq} and no call is the majority's")
        return FlightFinding(FlightKind.MISMATCH, label, seq, culprits, summary, lines)
    return None


def _behind(label: str, ops: dict[int, dict[int, FlightEntry]]) -> FlightFinding | None:
    newest = {r: max(by_seq) for r, by_seq in ops.items() if by_seq}
    if not newest:
        return None
    front = max(newest.values())
    waiting = sorted(r for r, s in newest.items() if s == front and not ops[r][s].retired)
    behind = sorted(r for r, s in newest.items() if s < front)
    if not waiting or not behind:
        return None
    entry = ops[waiting[0]][front]
    last = ", ".join(f"rank {r} up to #{newest[r]}" for r in behind[:8]) + (", ..." if len(behind) > 8 else "")
    summary = (f"{_who(behind)} {'has' if len(behind) == 1 else 'have'} not called collective #{front} "
               f"({entry.describe()}) of {label}, which {_who(waiting)} "
               f"{'waits' if len(waiting) == 1 else 'wait'} in (flight recorder)")
    started = (f"{_who(waiting)} issued collective #{front} ({entry.describe()}) of {label} and "
               f"{'has' if len(waiting) == 1 else 'have'} not finished it")
    evidence = (started, f"issued so far on {label}: {last}")
    return FlightFinding(FlightKind.BEHIND, label, front, tuple(behind), summary, evidence)


def _all_in(label: str, ops: dict[int, dict[int, FlightEntry]]) -> FlightFinding | None:
    newest = {r: max(by_seq) for r, by_seq in ops.items() if by_seq}
    if len(newest) < 2 or len(set(newest.values())) != 1:
        return None
    seq = next(iter(newest.values()))
    entries = [ops[r][seq] for r in newest]
    if any(e.retired for e in entries):
        return None
    ranks = sorted(newest)
    line = (f"{_who(ranks)} all issued collective #{seq} ({entries[0].describe()}) of {label}; "
            f"none has finished it (flight recorder)")
    return FlightFinding(FlightKind.ALL_IN, label, seq, (), line, (line,))


def _who(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress_ranks(ranks)[1:-1]}"


# ------------------------------------------------------------------ into the diagnosis


def apply_flight(diagnosis: Diagnosis, finding: FlightFinding | None, stacks: bool = True) -> Diagnosis:
    """The stack diagnosis, sharpened or overridden by what the dumps say. Without
    ``stacks`` (dumps alone), the finding is the diagnosis, at medium confidence: one dump
    per rank cannot show whether the ranks still wait."""
    if finding is None:
        return diagnosis
    if not stacks:
        return _dumps_alone(diagnosis, finding)
    if diagnosis.verdict is Verdict.NOT_HUNG:
        note = f"flight recorder (not weighed: the stacks saw progress): {finding.summary}"
        return dataclasses.replace(diagnosis, evidence=(*diagnosis.evidence, note))
    if finding.kind is FlightKind.ALL_IN:
        basis = (f"flight recorder: every rank of {finding.group} issued collective #{finding.seq}",)
        return dataclasses.replace(diagnosis, evidence=(*diagnosis.evidence, *finding.evidence),
                                   basis=(*basis, *diagnosis.basis))
    verdict = Verdict.COLLECTIVE_MISMATCH if finding.kind is FlightKind.MISMATCH else Verdict.STRAGGLER
    if finding.kind is FlightKind.BEHIND and diagnosis.verdict is Verdict.COLLECTIVE_MISMATCH:
        verdict = Verdict.COLLECTIVE_MISMATCH  # the ranks behind wait in some other collective
    agrees = diagnosis.verdict is verdict and (not finding.culprits or
                                               tuple(sorted(finding.culprits)) == diagnosis.culprit_ranks)
    basis_line = (f"flight recorder: collective #{finding.seq} of {finding.group} "
                  + ("differs between ranks" if finding.kind is FlightKind.MISMATCH
                     else "not yet called by the culprits"))
    if agrees:
        return dataclasses.replace(
            diagnosis, evidence=(*finding.evidence, *diagnosis.evidence),
            basis=(basis_line, *diagnosis.basis),
            # a rank still working (ambiguous) stays as unsure as the stacks leave it: the
            # dumps show it has not issued the collective, not that it never will
            confidence=Confidence.HIGH if finding.culprits and not diagnosis.ambiguous else diagnosis.confidence)
    overridden = (f"the stacks alone read {diagnosis.verdict.value}"
                  + (f" (culprits {', '.join(map(str, diagnosis.culprit_ranks))})" if diagnosis.culprit_ranks else "")
                  + f": {diagnosis.summary}; the flight recorder overrides it")
    return dataclasses.replace(
        diagnosis, verdict=verdict, culprit_ranks=tuple(sorted(finding.culprits)),
        summary=finding.summary, evidence=(*finding.evidence, overridden, *diagnosis.evidence),
        basis=(basis_line, *diagnosis.basis),
        confidence=Confidence.HIGH if finding.culprits else Confidence.MEDIUM, ambiguous=False)


def _dumps_alone(diagnosis: Diagnosis, finding: FlightFinding) -> Diagnosis:
    unsure = "no stacks: one dump per rank cannot show whether the ranks still wait"
    if finding.kind is FlightKind.ALL_IN:
        return dataclasses.replace(
            diagnosis, summary=f"every rank waits in the same collective by the flight recorder: {finding.summary}",
            evidence=finding.evidence, basis=(unsure,))
    verdict = Verdict.COLLECTIVE_MISMATCH if finding.kind is FlightKind.MISMATCH else Verdict.STRAGGLER
    basis = (f"flight recorder: collective #{finding.seq} of {finding.group} "
             + ("differs between ranks" if finding.kind is FlightKind.MISMATCH else "not yet called by the culprits"),
             unsure)
    return dataclasses.replace(
        diagnosis, verdict=verdict, culprit_ranks=tuple(sorted(finding.culprits)), summary=finding.summary,
        evidence=finding.evidence, basis=basis,
        confidence=Confidence.MEDIUM if finding.culprits else Confidence.LOW, ambiguous=False)
