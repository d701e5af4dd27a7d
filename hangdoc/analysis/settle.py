"""The classifier's last rules: what the flight recorder, the GPUs and NCCL's RAS make of
the verdict the stacks gave. They run inside ``classify.classify``, before any confidence
is judged, and record how they weighed (``FlightSaid``, ``DevicesSaid``): the levels they
lead to are rows of ``confidence.SETTLED``.

The flight recorder (``flight.match_flight``) sharpens or overrides the stacks: a verdict
of its own decides; culprits of the stacks its dumps show past the collective the others
wait in are overruled (``unknown``); alone (dumps without stacks) it is the verdict. The
GPUs and RAS (``gpu_state``) may name a transport hang's culprits, or turn it into a
``straggler`` when RAS's launch counts show ranks behind; otherwise they are evidence (the
reasons are in ``gpu_state``'s module doc).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..model import Evidence, Verdict
from ..rankranges import rank_phrase
from .finding import Classification, DeviceRole, DevicesSaid, FlightRole, FlightSaid
from .flight import FlightFinding, FlightKind
from .gpu_state import DeviceFindings

# what the basis says where the GPUs or RAS agree with the culprits (or, for RAS, name them)
RAS_BEHIND = "NCCL RAS: the culprits launched fewer collectives than the others"
NVML_IDLE = "NVML: the culprits' GPUs are idle while the others' run"


def by_flight(stacks: Classification, finding: FlightFinding | None, had_stacks: bool) -> Classification:
    """The stacks' classification, sharpened or overridden by what the dumps say. Without
    stacks (dumps alone) the finding is the classification."""
    if finding is None:
        return stacks
    if not had_stacks:
        return _dumps_alone(stacks, finding)
    if stacks.verdict is Verdict.NOT_HUNG:
        note = f"flight recorder (not weighed: the stacks saw progress): {finding.summary}"
        return _said(stacks, FlightRole.NOT_WEIGHED, finding, evidence=(*stacks.evidence, Evidence(note)))
    if finding.kind in (FlightKind.IDLE, FlightKind.UNPAIRED):  # consistent with any wait: evidence only
        return _said(stacks, FlightRole.EVIDENCE, finding, evidence=(*stacks.evidence, *_lines(finding.evidence)))
    cleared = sorted(set(finding.cleared) & set(stacks.culprits))
    if finding.verdict is None and cleared:
        # the stacks blame ranks the dumps show past the collective the others wait in
        overruled = (
            f"the stacks alone read {stacks.verdict.value} (culprits "
            f"{', '.join(map(str, stacks.culprits))}): {stacks.summary}; the flight recorder "
            f"shows {rank_phrase(cleared)} finished {'its' if len(cleared) == 1 else 'their'} side of "
            f"collective #{finding.seq} of {finding.group}, which the others wait in"
        )
        return _said(
            stacks,
            FlightRole.OVERRULES,
            finding,
            verdict=Verdict.UNKNOWN,
            culprits=(),
            summary=finding.summary,
            evidence=(*_lines(finding.evidence), Evidence(overruled), *stacks.evidence),
            ambiguous=False,
        )
    if finding.verdict is None:
        return _said(stacks, FlightRole.NOTED, finding, evidence=(*stacks.evidence, *_lines(finding.evidence)))
    verdict = finding.verdict
    if verdict is Verdict.STRAGGLER and stacks.verdict is Verdict.COLLECTIVE_MISMATCH:
        verdict = Verdict.COLLECTIVE_MISMATCH  # the ranks behind wait in some other collective
    if stacks.verdict is verdict and (not finding.culprits or tuple(sorted(finding.culprits)) == stacks.culprits):
        return _said(stacks, FlightRole.AGREES, finding, evidence=(*_lines(finding.evidence), *stacks.evidence))
    overridden = (
        f"the stacks alone read {stacks.verdict.value}"
        + (f" (culprits {', '.join(map(str, stacks.culprits))})" if stacks.culprits else "")
        + f": {stacks.summary}; the flight recorder overrides it"
    )
    return _said(
        stacks,
        FlightRole.OVERRIDES,
        finding,
        verdict=verdict,
        culprits=tuple(sorted(finding.culprits)),
        summary=finding.summary,
        evidence=(*_lines(finding.evidence), Evidence(overridden), *stacks.evidence),
        ambiguous=False,
    )


def _dumps_alone(stacks: Classification, finding: FlightFinding) -> Classification:
    if finding.verdict is None:
        summary = (
            f"every rank waits in the same collective by the flight recorder: {finding.summary}"
            if finding.kind is FlightKind.ALL_IN
            else finding.summary
        )
        return _said(stacks, FlightRole.ALONE_SAYS, finding, summary=summary, evidence=_lines(finding.evidence))
    return _said(
        stacks,
        FlightRole.ALONE,
        finding,
        verdict=finding.verdict,
        culprits=tuple(sorted(finding.culprits)),
        summary=finding.summary,
        evidence=_lines(finding.evidence),
        ambiguous=False,
    )


def _lines(texts: Iterable[str]) -> tuple[Evidence, ...]:
    return tuple(map(Evidence, texts))


def _said(stacks: Classification, role: FlightRole, finding: FlightFinding, **changes: object) -> Classification:
    return dataclasses.replace(stacks, flight=FlightSaid(role, finding), **changes)  # type: ignore[arg-type]


def by_devices(result: Classification, found: DeviceFindings | None, not_seen: tuple[int, ...]) -> Classification:
    """The classification with what the GPUs and RAS say folded in (module doc)."""
    if found is None:
        return result
    progressing = result.verdict is Verdict.NOT_HUNG
    said = _lines(found.evidence(progressing))
    if not said:
        return result
    evidence = (*result.evidence, *said)
    next_steps = (*result.next_steps, *(s for s in found.next_steps if s not in result.next_steps))
    behind, lag = found.behind(progressing)
    culprits = set(result.culprits)
    agreeing = (
        *((RAS_BEHIND,) if culprits and culprits == set(behind) else ()),
        *((NVML_IDLE,) if culprits and found.idle and culprits == set(found.idle) and found.busy else ()),
    )
    plain = DevicesSaid(DeviceRole.EVIDENCE, agreeing)
    # every rank seen waits in one op and the ranks not seen decide (``unknown``): RAS sees
    # every rank of the communicator, so one it cannot reach among them decides it
    unseen_named = (
        result.verdict is Verdict.UNKNOWN and bool(set(found.unreachable) & set(not_seen)) and not result.culprits
    )
    if result.verdict is not Verdict.NCCL_TIMEOUT and not unseen_named:
        return dataclasses.replace(result, evidence=evidence, next_steps=next_steps, devices=plain)
    if unseen_named:
        result = dataclasses.replace(result, verdict=Verdict.NCCL_TIMEOUT)
    if behind:
        overridden = f"the stacks alone read nccl_timeout: {result.summary}; NCCL RAS's launch counts override it"
        return dataclasses.replace(
            result,
            verdict=Verdict.STRAGGLER,
            culprits=behind,
            summary=(
                f"{rank_phrase(behind)} launched fewer NCCL collectives than the other ranks of "
                "their communicator (NCCL RAS): the others wait for them"
            ),
            evidence=(Evidence(lag), Evidence(overridden), *(e for e in evidence if e != Evidence(lag))),
            next_steps=next_steps,
            ambiguous=False,
            devices=dataclasses.replace(plain, role=DeviceRole.BEHIND),
        )
    named = tuple(sorted(set(found.unreachable) | set(found.faulty)))
    if named and not result.culprits:
        how = []
        if found.unreachable:
            how.append(f"NCCL RAS cannot reach {rank_phrase(found.unreachable)}")
        if found.faulty:
            how.append(f"NVML reports a fault on the GPU of {rank_phrase(found.faulty)}")
        return dataclasses.replace(
            result,
            culprits=named,
            summary=f"{result.summary}; {'; '.join(how)}",
            evidence=evidence,
            next_steps=next_steps,
            devices=DevicesSaid(DeviceRole.NAMED, plain.agreeing, tuple(how)),
        )
    return dataclasses.replace(result, evidence=evidence, next_steps=next_steps, devices=plain)
