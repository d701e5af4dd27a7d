"""What the ranks' in-process probes (``hangdoc.probe``) tell, asked once per diagnosis: each
one's flight recorder dump, step heartbeat and threads' live exceptions.

Every node holding live ranks is asked at once (``Node.probe``). Most jobs run without a
probe: a rank without one is left out, and that is said only when some rank has one. A
node that fails costs a note (its ranks' probes did not answer), never the diagnosis.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..errors import one_line
from ..model import Note, ProbeAnswer, ProbeStatus, counted
from .coordinator import Fleet, NodeAnswer, fan_out_pids
from .node import ProbeAnswers

PROBE_TIMEOUT = 3.0  # seconds for a rank's probe to answer (its flight recorder dump and the rest)
_SLACK = 15.0  # seconds beyond that a node may take (network, queueing)


@dataclass(frozen=True)
class JobProbes:
    """What the probes told, by index into ``Fleet.placed`` (only the ranks whose probe
    answered), and notes that say how it went."""

    answers: Mapping[int, ProbeAnswer]
    notes: tuple[Note, ...] = ()


def ask_probes(
    fleet: Fleet, live: Collection[int], lost: Collection[str] = (), *, timeout: float = PROBE_TIMEOUT
) -> JobProbes:
    """Ask the probe of every ``live`` rank (indices into ``fleet.placed``) on the nodes not
    ``lost`` (by name)."""
    answers: dict[int, ProbeAnswer] = {}
    failed: list[str] = []  # a probe that did not answer
    no_dump: list[str] = []  # a probe that answered without a flight recorder dump
    for told in fan_out_pids(
        fleet, lambda node, pids: node.probe(pids, timeout), timeout + _SLACK, only=live, skip=lost
    ):
        for pid, answer in _answers(told).items():
            i = told.ranks.get(pid)
            if i is None or answer.status is ProbeStatus.NO_PROBE:
                continue
            if answer.status is ProbeStatus.FAILED:
                failed.append(f"pid {pid}: {answer.reason}")
                continue
            answers[i] = answer
            if answer.flight is None:
                no_dump.append(f"pid {pid}: {answer.reason}")
    notes = []
    if dumps := sum(a.flight is not None for a in answers.values()):
        notes.append(f"flight recorder dumps of {dumps} of {counted(len(fleet.placed), 'rank')}, through their probes")
    for what, which in (("no answer from the probe of ", failed), ("no flight recorder dump from ", no_dump)):
        if which:
            notes.append(what + "; ".join(which[:4]) + (f"; and {len(which) - 4} more" if len(which) > 4 else ""))
    return JobProbes(answers, tuple(map(Note, notes)))


def _answers(told: NodeAnswer[ProbeAnswers]) -> ProbeAnswers:
    """A node's answers; a node that failed, a failed answer for each of its ranks (one that
    missed the deadline: none)."""
    if told.error is not None:
        why = one_line(str(told.error) or type(told.error).__name__, 300)
        return {pid: ProbeAnswer(ProbeStatus.FAILED, why) for pid in told.ranks}
    return told.value or {}
