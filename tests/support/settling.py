"""The flight recorder's rule (``analysis.settle.by_flight``) and the confidence it leads to
(``analysis.confidence.settled``), applied to a stacks-only diagnosis a test has shaped by
hand: what a stack diagnosis that is ambiguous, or less sure, becomes once the dumps weigh
in, without building stacks that give exactly that."""

from __future__ import annotations

import dataclasses

from hangdoc.analysis.confidence import Judgement, settled
from hangdoc.analysis.facts import NothingCaptured
from hangdoc.analysis.finding import Classification, Finding
from hangdoc.analysis.flight import FlightFinding
from hangdoc.analysis.settle import by_flight
from hangdoc.model import Diagnosis


def with_dumps(stacks: Diagnosis, found: FlightFinding | None, *, had_stacks: bool = True) -> Diagnosis:
    """``stacks`` (a diagnosis from stacks alone) as the dumps' ``found`` leaves it."""
    finding = Finding(stacks.verdict, list(stacks.culprit_ranks), NothingCaptured(), ambiguous=stacks.ambiguous)
    before = Classification(
        finding,
        stacks.verdict,
        stacks.culprit_ranks,
        stacks.summary,
        stacks.evidence,
        stacks.next_steps,
        stacks.ambiguous,
    )
    after = by_flight(before, found, had_stacks)
    level, basis = settled(after, Judgement(stacks.confidence, stacks.basis))
    return dataclasses.replace(
        stacks,
        verdict=after.verdict,
        culprit_ranks=after.culprits,
        summary=after.summary,
        evidence=after.evidence,
        next_steps=after.next_steps,
        ambiguous=after.ambiguous,
        confidence=level,
        basis=tuple(basis),
    )
