"""The facts the classifier's rules found, as values: one type per outcome of
``classify.decide`` (``Facts``). ``wording`` turns them into sentences; ``confidence``
weighs them. No words here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..model import DistOp, Frame
from .beyond import Chain
from .structure import Structure
from .views import RankView, op_keys


@dataclass(frozen=True)
class NothingCaptured:
    """No rank could be captured at all."""


@dataclass(frozen=True)
class Progressing:
    """These ranks completed distributed operations during the window (``waiting``: the
    ranks that did not, and sat in one op the whole window)."""

    ranks: Sequence[RankView]
    waiting: Sequence[RankView] = ()


@dataclass(frozen=True)
class DataMoving:
    """Nobody waits; these ranks are inside an op and bytes or CPU move."""

    communicating: Sequence[RankView]


@dataclass(frozen=True)
class Unseen:
    """Every readable rank waits in one op; ``unseen`` could not be read at all."""

    unseen: Sequence[RankView]
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class Working:
    """Nobody is in a distributed op; these ranks work (CPU, I/O, changing stacks)."""

    busy: Sequence[RankView]


@dataclass(frozen=True)
class RanksGone:
    """``gone`` (missing or ``exited``) have no process while ``waiting`` wait in an op."""

    gone: Sequence[int]
    exited: Sequence[int]
    world: int
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class InitSplit:
    """``init`` wait in init/rendezvous; ``others`` went past it or never reached it."""

    init: Sequence[RankView]
    others: Sequence[RankView]
    went_past: bool


@dataclass(frozen=True)
class EnvSplit:
    """Ranks disagree on one rendezvous variable: value -> ranks, in the order first seen."""

    key: str
    values: Mapping[str | None, Sequence[int]]


@dataclass(frozen=True)
class InitStuck:
    """Every rank waits in init/rendezvous; ``differ`` are the odd ones out, if any."""

    init: Sequence[RankView]
    differ: Sequence[int]
    env: EnvSplit | None = None


@dataclass(frozen=True)
class CleanupStuck:
    """``cleanup`` left the training loop and wait in cleanup while ``training`` wait in an op;
    with no ``training`` rank seen, cleanup seen from one side: ``unseen`` were not seen."""

    cleanup: Sequence[RankView]
    training: Sequence[RankView]
    unseen: Sequence[int] = ()


@dataclass(frozen=True)
class ThreadsRace:
    """``raced`` have two threads or more waiting in collectives on one process group at
    once (``RankView.side_ops``): the order they reach the group is a race between ranks;
    ``others`` are the other ranks in an op."""

    raced: Sequence[RankView]
    others: Sequence[RankView]


@dataclass(frozen=True)
class Straggling:
    """``outside`` are outside any op (computing, blocked, stopped) while ``waiting`` wait."""

    outside: Sequence[RankView]
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class Unpaired:
    """``rank`` sends to / receives from ``peer``, which is in ``peer_op`` (or none)."""

    rank: int
    op: DistOp
    receiving: bool
    peer: int
    peer_op: DistOp | None


@dataclass(frozen=True)
class AllReceive:
    """Every rank in an op receives, and none sends."""

    receivers: Sequence[int]


P2PFact = Unpaired | AllReceive


@dataclass(frozen=True)
class Mismatch:
    """Ranks wait in different ops: ``groups`` by op, largest first; ``p2p``: unpaired calls."""

    groups: Sequence[Sequence[RankView]]
    culprits: Sequence[int]
    p2p: Sequence[P2PFact] = ()
    by_peers: bool = False  # the culprits are named by the p2p calls, not as the minority
    # where the ranks' paths part when their ops name no minority: (frame, ranks), largest first
    parted: Sequence[tuple[Frame, Sequence[RankView]]] = ()
    # the culprits are on WORLD and the others wait on groups their callers passed, at
    # several places (``structure``): the culprits left that structure
    structure: Structure | None = None
    # the culprits are a path smaller than each place of a structure of groups, where the
    # paths part: named by the tree's shape alone
    by_tree: bool = False
    # the few ranks in collectives on groups their callers passed, while the rest wait in a
    # WORLD op: they wait for fellow members who are in the WORLD op, not named by stacks
    waiting_for_members: Sequence[RankView] = ()


@dataclass(frozen=True)
class GroupsApart:
    """Every rank in an op waits on a group its caller passed, at several places, and each
    place could hold whole groups of ``size`` ranks: ranks of different groups wait apart
    legitimately, and no small set of ranks is outside that structure. ``from_lines``: the
    groups were read from call lines, not arguments."""

    groups: Sequence[Sequence[RankView]]
    size: int
    from_lines: bool = False


@dataclass(frozen=True)
class SameOp:
    """Every rank in an op waits in the same one and nothing moves."""

    waiting: Sequence[RankView]


@dataclass(frozen=True)
class SeenInOneOp:
    """Every rank seen waits in the same op; ``unseen`` ranks of the job were not seen, and
    what they do decides between a transport hang and a rank the others wait for."""

    waiting: Sequence[RankView]
    unseen: Sequence[int]


@dataclass(frozen=True)
class Teardown:
    """Every rank of the job waits in the same op on its way out (``destroy_process_group``,
    a barrier in ``__exit__``/``finally``, atexit)."""

    waiting: Sequence[RankView]


@dataclass(frozen=True)
class DeviceWaits:
    """Every rank in an op waits in it or at a host sync, at least one at a host sync
    (``device``), and their ops do not disagree: ``device`` wait for device work whose
    collective stacks do not show; ``known`` are in a torch.distributed op (one)."""

    device: Sequence[RankView]
    known: Sequence[RankView] = ()

    @property
    def one_site(self) -> bool:
        """Every rank waits at the same host sync (none in a torch.distributed op)."""
        key = op_keys()
        return not self.known and len({key(v.op) for v in self.device if v.op}) == 1


@dataclass(frozen=True)
class Unexplained:
    """Nobody is in a distributed op and nothing moves."""

    views: Sequence[RankView]


@dataclass(frozen=True)
class WaitsOutside:
    """No rank is in a distributed op; every rank seen is off CPU with a wait that leaves
    the ranks (``chains``: by rank). ``partial``: the job has ranks nobody saw (``unknown``
    where their numbers are known), which keep it from being a claim about the whole job."""

    views: Sequence[RankView]
    chains: Mapping[int, Chain]
    partial: bool = False
    unknown: Sequence[int] = ()


Facts = (
    NothingCaptured
    | Progressing
    | DataMoving
    | Working
    | RanksGone
    | InitSplit
    | InitStuck
    | CleanupStuck
    | Straggling
    | Unseen
    | Mismatch
    | SameOp
    | DeviceWaits
    | Unexplained
    | GroupsApart
    | SeenInOneOp
    | Teardown
    | ThreadsRace
    | WaitsOutside
)
