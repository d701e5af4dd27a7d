"""The GPUs of every rank and NCCL's RAS report of the job, gathered once per diagnosis.

Every node is asked at once (``Node.devices``) for the GPUs its live ranks run on (NVML);
the node of the lowest rank also runs NCCL's RAS client, whose report covers the whole job
(asking every node would start as many RAS collectives). A node that fails, or an agent
without the call, costs a note, never the diagnosis. ``JobDevices.apply`` puts what came
back into the snapshot: each rank's ``gpus``, the job's ``ras``, and notes that say how it
went, only where there is something to say (a CPU job on a machine without GPUs gets none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ..model import GpuState, JobSnapshot, NcclRasReport, Note, counted
from .coordinator import Fleet, NodeAnswer, fan_out_pids
from .node import Node, NodeDevices

DEVICES_TIMEOUT = 5.0  # seconds for a node's NVML answers, and for RAS's wait for the job
XID_LISTEN = 0.5  # seconds each node listens for XID events
_SLACK = 10.0  # seconds beyond those a node may take (RAS client start, network)


@dataclass(frozen=True)
class JobDevices:
    """What the nodes told: GPUs by index into ``Fleet.placed``, the RAS report, notes."""

    gpus: Mapping[int, tuple[GpuState, ...]]
    ras: NcclRasReport | None = None
    notes: tuple[Note, ...] = ()

    def apply(self, snapshot: JobSnapshot) -> JobSnapshot:
        """``snapshot`` (whose ranks are in ``Fleet.placed`` order) with these in it."""
        if not self.gpus and self.ras is None and not self.notes:
            return snapshot
        ranks = tuple(
            dataclasses.replace(r, gpus=self.gpus[i]) if i in self.gpus else r for i, r in enumerate(snapshot.ranks)
        )
        return dataclasses.replace(snapshot, ranks=ranks, ras=self.ras, notes=(*snapshot.notes, *self.notes))


NO_DEVICES = JobDevices({})


def gather_devices(
    fleet: Fleet,
    live: Collection[int],
    lost: Collection[str] = (),
    *,
    listen: float = XID_LISTEN,
    timeout: float = DEVICES_TIMEOUT,
) -> JobDevices:
    """Ask every node holding ``live`` ranks (indices into ``fleet.placed``), except the
    ``lost`` ones (by name), for its ranks' GPUs; the first node also for RAS."""
    nodes = [node for node, _ in fleet.by_node(set(live)) if node.name not in lost]
    if not nodes:
        return NO_DEVICES
    first = nodes[0]

    def ask(node: Node, pids: list[int]) -> NodeDevices:
        # a node of another kind may offer none
        offered: Callable[..., NodeDevices] | None = getattr(node, "devices", None)
        if offered is None:
            return NodeDevices()
        return offered(pids, listen=listen, timeout=timeout, ras=node is first)

    gpus: dict[int, tuple[GpuState, ...]] = {}
    reasons: dict[str, list[str]] = {}
    ras, ras_reason = None, ""
    for told in fan_out_pids(fleet, ask, timeout + listen + _SLACK, only=live, skip=lost):
        answer = _answer(told, told.node is first)
        gpus.update({told.ranks[pid]: states for pid, states in answer.gpus.items() if pid in told.ranks and states})
        if answer.gpu_reason:
            reasons.setdefault(answer.gpu_reason, []).append(told.node.name)
        if told.node is first:
            ras, ras_reason = answer.ras, answer.ras_reason
    notes = [f"GPU state (NVML) of {len(gpus)} of {counted(len(fleet.placed), 'rank')}"] if gpus else []
    notes += [
        f"GPU state on {', '.join(names[:4])}{' and more' if len(names) > 4 else ''}: {why}"
        for why, names in reasons.items()
    ]
    if ras is not None:
        notes.append(f"NCCL RAS report ({ras.source or 'ncclras'}): {counted(len(ras.communicators), 'communicator')}")
    elif ras_reason:
        notes.append(f"no NCCL RAS report: {ras_reason}")
    return JobDevices(gpus, ras, tuple(map(Note, notes)))


def _answer(told: NodeAnswer[NodeDevices], ras: bool) -> NodeDevices:
    """A node's answer, its failure made reasons: device state refines a diagnosis, never
    fails it."""
    if told.error is not None:
        why = (str(told.error) or type(told.error).__name__)[:300]
        return NodeDevices(gpu_reason=why, ras_reason=why if ras else "")
    if told.value is None:
        return NodeDevices(
            gpu_reason=f"no answer: {told.missed}", ras_reason=f"no answer: {told.missed}" if ras else ""
        )
    return told.value
