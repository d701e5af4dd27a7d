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
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..model import GpuState, JobSnapshot, NcclRasReport
from .coordinator import Fleet, fan_out
from .node import Node, NodeDevices

DEVICES_TIMEOUT = 5.0  # seconds for a node's NVML answers, and for RAS's wait for the job
XID_LISTEN = 0.5  # seconds each node listens for XID events
_SLACK = 10.0  # seconds beyond those a node may take (RAS client start, network)


@dataclass(frozen=True)
class JobDevices:
    """What the nodes told: GPUs by index into ``Fleet.placed``, the RAS report, notes."""

    gpus: Mapping[int, tuple[GpuState, ...]]
    ras: NcclRasReport | None = None
    notes: tuple[str, ...] = ()

    def apply(self, snapshot: JobSnapshot) -> JobSnapshot:
        """``snapshot`` (whose ranks are in ``Fleet.placed`` order) with these in it."""
        if not self.gpus and self.ras is None and not self.notes:
            return snapshot
        ranks = tuple(dataclasses.replace(r, gpus=self.gpus[i]) if i in self.gpus else r
                      for i, r in enumerate(snapshot.ranks))
        return dataclasses.replace(snapshot, ranks=ranks, ras=self.ras,
                                   notes=(*snapshot.notes, *self.notes))


NO_DEVICES = JobDevices({})


def gather_devices(
    fleet: Fleet, live: Collection[int], lost: Collection[str] = (), *,
    listen: float = XID_LISTEN, timeout: float = DEVICES_TIMEOUT,
) -> JobDevices:
    """Ask every node holding ``live`` ranks (indices into ``fleet.placed``), except the
    ``lost`` ones (by name), for its ranks' GPUs; the first node also for RAS."""
    groups = [(node, idx) for node, idx in fleet.by_node(set(live)) if node.name not in lost]
    if not groups:
        return NO_DEVICES
    first = groups[0][0]
    pids = {id(node): [fleet.placed[i][1].pid for i in idx] for node, idx in groups}

    def ask(node: Node) -> NodeDevices:
        offered = getattr(node, "devices", None)  # a node of another kind may offer none
        if offered is None:
            return NodeDevices()
        try:
            return offered(pids[id(node)], listen=listen, timeout=timeout, ras=node is first)
        except Exception as err:  # noqa: BLE001 - device state refines a diagnosis, never fails it
            why = str(err) or type(err).__name__
            return NodeDevices(gpu_reason=why[:300], ras_reason=why[:300] if node is first else "")

    gpus: dict[int, tuple[GpuState, ...]] = {}
    reasons: dict[str, list[str]] = {}
    ras, ras_reason = None, ""
    for node, found, err in fan_out([n for n, _ in groups], ask, timeout + listen + _SLACK):
        answer = found if found is not None else NodeDevices(
            gpu_reason=f"no answer: {err}", ras_reason=f"no answer: {err}" if node is first else "")
        index = {fleet.placed[i][1].pid: i for n, idx in groups if n is node for i in idx}
        gpus.update({index[pid]: states for pid, states in answer.gpus.items() if pid in index and states})
        if answer.gpu_reason:
            reasons.setdefault(answer.gpu_reason, []).append(node.name)
        if node is first:
            ras, ras_reason = answer.ras, answer.ras_reason
    notes = [f"GPU state (NVML) of {len(gpus)} of {len(fleet.placed)} rank(s)"] if gpus else []
    notes += [f"GPU state on {', '.join(names[:4])}{' and more' if len(names) > 4 else ''}: {why}"
              for why, names in reasons.items()]
    if ras is not None:
        notes.append(f"NCCL RAS report ({ras.source or 'ncclras'}): {len(ras.communicators)} communicator(s)")
    elif ras_reason:
        notes.append(f"no NCCL RAS report: {ras_reason}")
    return JobDevices(gpus, ras, tuple(notes))
