"""What the classifier decides, as values: the stacks' ``Finding``, what the other sources
(the flight recorder, the GPUs and NCCL's RAS) made of it, and the whole ``Classification``
that ``confidence.judge`` weighs and ``analyse`` turns into the ``Diagnosis``."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..model import Evidence, RootCause, Verdict
from .facts import Facts
from .flight import FlightFinding
from .gpu_state import DeviceFindings
from .views import RankView


@dataclass(frozen=True)
class Finding:
    """What the stack rules decided, before any words.

    ``facts`` is the ``facts`` type of the rule that applied; ``quiet_over`` are the
    ranks whose stillness backs a hang verdict (their counters are quoted), None when
    stillness is not part of the evidence.
    """

    verdict: Verdict
    culprits: list[int]
    facts: Facts
    ambiguous: bool = False
    quiet_over: Sequence[RankView] | None = None


class FlightRole(enum.Enum):
    """How the flight recorder's finding weighed on the stacks' verdict."""

    NOT_WEIGHED = "not_weighed"
    """The stacks saw the job move: the dumps' unfinished op is said, not weighed."""
    EVIDENCE = "evidence"
    """Nothing unfinished, or p2p ops not paired: consistent with any wait."""
    NOTED = "noted"
    """The dumps support no verdict of their own: their finding adds to the basis."""
    OVERRULES = "overrules"
    """The dumps show the stacks' culprits finished their side of the collective the others
    wait in: the verdict becomes ``unknown``."""
    AGREES = "agrees"
    """The dumps give the stacks' verdict and culprits (or name none)."""
    OVERRIDES = "overrides"
    """The dumps give another verdict or other culprits, and decide."""
    ALONE = "alone"
    """Dumps and no stacks: the dumps' verdict is the verdict."""
    ALONE_SAYS = "alone_says"
    """Dumps and no stacks, and the dumps support no verdict: they give the words only."""


@dataclass(frozen=True)
class FlightSaid:
    role: FlightRole
    finding: FlightFinding


class DeviceRole(enum.Enum):
    """How the GPUs' state and NCCL's RAS weighed on the verdict."""

    EVIDENCE = "evidence"
    """Said, and agreeing phrases added to the basis; the verdict stays."""
    BEHIND = "behind"
    """RAS's launch counts show ranks behind the others: ``straggler``."""
    NAMED = "named"
    """Transport evidence names the culprits a transport hang did not."""


@dataclass(frozen=True)
class DevicesSaid:
    role: DeviceRole
    agreeing: tuple[str, ...] = ()  # basis phrases of evidence that agrees with the culprits
    named_how: tuple[str, ...] = ()  # NAMED: how the transport evidence named the culprits


@dataclass(frozen=True)
class Told:
    """What sources other than the stacks tell, read from the snapshot before the verdict is
    decided."""

    flight: FlightFinding | None = None  # ``flight.match_flight``
    had_stacks: bool = True  # the snapshot has stack samples (dumps of flight records alone have none)
    devices: DeviceFindings | None = None  # ``gpu_state.find``


@dataclass(frozen=True)
class Classification:
    """The verdict decided once, in words: the stacks' ``finding`` with what the other
    sources made of it (``flight``, ``devices``; None where a source told nothing)."""

    finding: Finding
    verdict: Verdict
    culprits: tuple[int, ...]
    summary: str
    evidence: tuple[Evidence, ...]
    next_steps: tuple[str, ...]
    ambiguous: bool
    flight: FlightSaid | None = None
    devices: DevicesSaid | None = None
    root: RootCause | None = None  # where the culprits' wait ends past the ranks (``beyond``)
