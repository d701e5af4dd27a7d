"""Ray's answers as hangdoc reads them (``capture.find.ray_workers``' values), built by hand for the
unit tests of ``capture.find.ray_workers`` and ``capture.find.ray_job``."""

from __future__ import annotations

from hangdoc.capture.find.ray_workers import ActorInfo

NODE_A, NODE_B = "a" * 56, "b" * 56
JOB = "02000000"


def actor(
    actor_id: str, cls: str = "RayTrainWorker", name: str = "", pid: int = 100, node: str = NODE_A, ip: str = "10.0.0.1"
) -> ActorInfo:
    return ActorInfo(actor_id, cls, name, pid, node, ip)


W0, W1, W2 = (actor(f"w{i}", pid=100 + i, node=(NODE_A, NODE_B, NODE_B)[i]) for i in range(3))
CONTROLLER = actor("ctl", "TrainController", pid=90)
SYNC = actor("sync", "SynchronizationActor", pid=91)
AGENT = actor("agent", "HangdocAgent", name="hangdoc-agent-x", pid=92)


def v2_worker(actor_id: str, rank: int, pid: int) -> dict:
    """One worker of a Train V2 run's attempt, as the dashboard's run state lists it."""
    return {
        "actor_id": actor_id,
        "world_rank": rank,
        "local_rank": rank % 2,
        "node_rank": 0,
        "node_id": NODE_A,
        "node_ip": "10.0.0.1",
        "pid": pid,
        "gpu_ids": [],
    }


CONTROLLER_LOG = """\
(TrainController pid=90) some start-up line
[2026-11-23 08:40:01,000 I 90 90] worker_group.py:433: Started training worker group of size 2:
- (ip=10.0.0.1, pid=50) world_rank=0, local_rank=0, node_rank=0
- (ip=10.0.0.1, pid=51) world_rank=1, local_rank=1, node_rank=0
a restart happened
Started training worker group of size 3:
- (ip=10.0.0.2, pid=101) world_rank=0, local_rank=0, node_rank=0
- (ip=10.0.0.1, pid=100) world_rank=1, local_rank=0, node_rank=1
- (ip=10.0.0.2, pid=102) world_rank=2, local_rank=1, node_rank=0
training...
"""
