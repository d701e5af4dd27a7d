"""What GPU state (NVML) and NCCL's RAS report add to a diagnosis (``analysis.gpu_state``):
the idle/busy split on both sides of its thresholds, faults on a rank's GPU, RAS's missing
ranks and launch-count lags, how communicator ranks are named as global ranks, and the
only verdict changes allowed (``nccl_timeout``'s culprits; a RAS lag under it)."""

from __future__ import annotations

import dataclasses

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.gpu_state import (
    BUSY_AT_LEAST,
    IDLE_AT_MOST,
    global_ranks,
    utilisation_split,
)
from hangdoc.capture.read.ncclras import read_ras_report
from hangdoc.model import (
    Confidence,
    Diagnosis,
    GpuState,
    JobSnapshot,
    NcclRasReport,
    RankSnapshot,
    RasCommunicator,
    RasRank,
    Unreachable,
    Verdict,
)

pytestmark = [pytest.mark.timeout(30)]
ALL_REDUCE = [
    "train.py:<module>:120",
    "train.py:main:10",
    "train.py:step:40",
    "torch/distributed/distributed_c10d.py:all_reduce:2800",
]
SLEEPING = ["train.py:<module>:120", "train.py:main:10", "train.py:load:77", "time.py:sleep"]
DATA = TESTS / "data" / "gpu"


def gpu(index: int, util: int | None, **kw: object) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-0000000{index}",
        name="NVIDIA H100 80GB HBM3",
        utilization_percent=util,
        memory_used_bytes=40 * 2**30,
        memory_total_bytes=80 * 2**30,
        **kw,
    )  # type: ignore[arg-type]


def said(diagnosis: Diagnosis) -> list[str]:
    """The words of a diagnosis' evidence, line by line, as a report writes them."""
    return [e.words() for e in diagnosis.evidence]


def with_gpus(snap: JobSnapshot, gpus: dict[int, tuple[GpuState, ...]]) -> JobSnapshot:
    ranks = tuple(dataclasses.replace(r, gpus=gpus.get(r.rank, ())) if r.rank is not None else r for r in snap.ranks)
    return dataclasses.replace(snap, ranks=ranks)


def all_waiting(n: int = 4) -> JobSnapshot:
    """Every rank in the same all_reduce, nothing moving: nccl_timeout from the stacks."""
    return make_snapshot([make_rank(r, ALL_REDUCE, pid=40100 + r) for r in range(n)])


def straggling() -> JobSnapshot:
    """Ranks 0-2 in all_reduce, rank 3 asleep elsewhere: straggler [3] from the stacks."""
    return make_snapshot(
        [make_rank(r, ALL_REDUCE, pid=40100 + r) for r in range(3)] + [make_rank(3, SLEEPING, pid=40103)]
    )


# ------------------------------------------------------------------ the idle/busy split


@pytest.mark.parametrize(
    ("idle_at", "busy_at", "split"),
    [
        (IDLE_AT_MOST, BUSY_AT_LEAST, True),  # on both thresholds: idle and busy
        (IDLE_AT_MOST + 1, BUSY_AT_LEAST, False),  # not idle enough
        (IDLE_AT_MOST, BUSY_AT_LEAST - 1, False),  # not busy enough
        (0, 100, True),
    ],
)
def test_the_split_on_both_sides_of_its_thresholds(idle_at: int, busy_at: int, split: bool) -> None:
    snap = with_gpus(
        straggling(), {0: (gpu(0, busy_at),), 1: (gpu(1, busy_at),), 2: (gpu(2, busy_at),), 3: (gpu(3, idle_at),)}
    )
    diagnosis = analyse(snap)
    line = f"GPUs of rank 3 at {idle_at}% while those of ranks 0-2 at {busy_at}%"
    assert any(e.startswith(line) for e in said(diagnosis)) is split
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (3,)  # never changed by it
    agreed = "NVML: the culprits' GPUs are idle while the others' run"
    assert (agreed in diagnosis.basis) is split
    assert diagnosis.confidence is analyse(straggling()).confidence


def test_the_seed_guide_s_split_is_worded_as_it_is_seen() -> None:
    snap = with_gpus(all_waiting(), {0: (gpu(0, 0),), 1: (gpu(1, 0),), 2: (gpu(2, 3),), 3: (gpu(3, 100),)})
    diagnosis = analyse(snap)
    assert any(
        e.startswith("GPUs of ranks 0-2 at 0-3% while rank 3's at 100% (NVML utilisation") for e in said(diagnosis)
    )
    assert diagnosis.verdict is Verdict.NCCL_TIMEOUT and diagnosis.culprit_ranks == ()  # utilisation alone: no culprit


def test_a_shared_gpu_or_a_missing_reading_takes_its_ranks_out_of_the_split() -> None:
    shared = gpu(3, 0)
    gpus = {0: (gpu(0, 100),), 1: (gpu(1, 100),), 2: (shared,), 3: (shared,)}
    assert utilisation_split(gpus) == ((), (0, 1))
    gpus = {0: (gpu(0, 100),), 1: (gpu(1, None),), 3: (gpu(3, 0),)}
    assert utilisation_split(gpus) == ((3,), (0,))
    # no UUID: told apart by node, so two nodes' GPU 0 are not one GPU
    nameless = {0: (GpuState(0, "", utilization_percent=100),), 1: (GpuState(0, "", utilization_percent=0),)}
    assert utilisation_split(nameless, {0: "n0", 1: "n1"}) == ((1,), (0,))
    assert utilisation_split(nameless, {0: "n0", 1: "n0"}) == ((), ())


def test_a_progressing_job_gets_no_split() -> None:
    moving = make_snapshot([make_rank(r, stacks=[ALL_REDUCE, SLEEPING, ALL_REDUCE], pid=40100 + r) for r in range(2)])
    diagnosis = analyse(with_gpus(moving, {0: (gpu(0, 100),), 1: (gpu(1, 0),)}))
    assert diagnosis.verdict is Verdict.NOT_HUNG
    assert not any("NVML utilisation" in e.words() for e in diagnosis.evidence)


def test_no_gpu_state_leaves_the_diagnosis_as_it_was() -> None:
    assert analyse(straggling()) == analyse(with_gpus(straggling(), {}))


# ------------------------------------------------------------------ faults on a GPU


def test_an_xid_names_the_culprit_of_a_transport_hang() -> None:
    snap = with_gpus(all_waiting(), {r: (gpu(r, 100, xids=(79,) if r == 2 else ()),) for r in range(4)})
    diagnosis = analyse(snap)
    assert diagnosis.verdict is Verdict.NCCL_TIMEOUT
    assert diagnosis.culprit_ranks == (2,)
    assert "rank 2's GPU 2 reported XID 79 during the capture (NVML events)" in said(diagnosis)
    assert diagnosis.summary.endswith("; NVML reports a fault on the GPU of rank 2")
    assert diagnosis.basis[0] == "culprits named by transport evidence: NVML reports a fault on the GPU of rank 2"
    assert diagnosis.confidence is analyse(all_waiting()).confidence
    assert any("dmesg -T | grep -i xid" in step for step in diagnosis.next_steps)


def test_a_lost_gpu_and_ecc_errors_are_evidence_under_any_verdict() -> None:
    lost = GpuState(index=3, uuid="", lost=True)
    snap = with_gpus(straggling(), {3: (lost,), 1: (gpu(1, 100, ecc_uncorrected=2),)})
    diagnosis = analyse(snap)
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (3,)
    assert "rank 3's GPU 3 is lost (NVML: fallen off the bus or inaccessible)" in said(diagnosis)
    assert "rank 1's GPU 1 counts 2 uncorrectable ECC errors since its driver loaded (NVML)" in said(diagnosis)


# ------------------------------------------------------------------ NCCL RAS


def ras_rank(comm_rank: int, pid: int | None, allreduce: int = 100, **kw: object) -> RasRank:
    fields: dict[str, object] = {
        "init_state": 0,
        "async_error": 0,
        "collectives": (("AllGather", 2), ("AllReduce", allreduce)),
        **kw,
    }
    return RasRank(comm_rank=comm_rank, host="10.0.0.11", pid=pid, cuda_dev=comm_rank, nvml_dev=comm_rank, **fields)  # type: ignore[arg-type]


def with_ras(snap: JobSnapshot, *comms: RasCommunicator) -> JobSnapshot:
    return dataclasses.replace(snap, ras=NcclRasReport("2.28.9", comms, source="ncclras on node0"))


def test_ras_s_dead_rank_names_the_culprit_of_a_transport_hang() -> None:
    report = read_ras_report((DATA / "ncclras_2.28.9_dead_rank.json").read_text())
    lost = Unreachable("node1:7420", "no answer within 15.0 s", (3,))  # rank 3's node did not answer
    snap = dataclasses.replace(all_waiting(3), world_size=4, ras=report, unreachable=(lost,))
    base = analyse(dataclasses.replace(snap, ras=None))
    # ranks 0-2 in one all_reduce, rank 3 not seen: the stacks alone cannot decide
    assert base.verdict is Verdict.UNKNOWN and base.culprit_ranks == () and base.scope.not_seen == (3,)
    diagnosis = analyse(snap)
    assert diagnosis.verdict is Verdict.NCCL_TIMEOUT and diagnosis.culprit_ranks == (3,)
    assert (
        "NCCL RAS 2.28.9: communicator 0x7d3a9c1e2f4b5a60 (4 ranks) cannot reach rank 3; 1 considered dead"
    ) in said(diagnosis)
    assert diagnosis.summary.endswith("; NCCL RAS cannot reach rank 3")
    assert "NCCL RAS 2.28.9: 2 timeouts while RAS gathered its data" in said(diagnosis)
    assert diagnosis.confidence is base.confidence


def test_ras_s_lag_overrides_a_transport_hang_read_from_stacks() -> None:
    report = read_ras_report((DATA / "ncclras_2.28.9_lagging_rank.json").read_text())
    snap = dataclasses.replace(all_waiting(), ras=report)
    diagnosis = analyse(snap)
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (2,)
    assert diagnosis.confidence is Confidence.MEDIUM
    assert diagnosis.summary == (
        "rank 2 launched fewer NCCL collectives than the other ranks of their "
        "communicator (NCCL RAS): the others wait for them"
    )
    assert said(diagnosis)[0].startswith(
        "NCCL RAS 2.28.9: communicator 0x7d3a9c1e2f4b5a60 (4 ranks): rank 2 launched fewer collectives than "
        "ranks 0-1,3 (AllReduce 1533 launched by the latter; rank 2 AllReduce 1532)"
    )
    assert said(diagnosis)[1].startswith("the stacks alone read nccl_timeout")
    assert diagnosis.basis[0] == "NCCL RAS: the culprits launched fewer collectives than the others"


def test_ras_s_lag_agrees_with_a_straggler_and_is_not_said_of_a_moving_job() -> None:
    comm = RasCommunicator("0xa", 4, tuple(ras_rank(r, 40100 + r, 100 if r != 3 else 99) for r in range(4)))
    diagnosis = analyse(with_ras(straggling(), comm))
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (3,)
    assert diagnosis.basis[0] == "NCCL RAS: the culprits launched fewer collectives than the others"
    moving = make_snapshot([make_rank(r, stacks=[ALL_REDUCE, SLEEPING, ALL_REDUCE], pid=40100 + r) for r in range(4)])
    moved = analyse(with_ras(moving, comm))
    assert moved.verdict is Verdict.NOT_HUNG and not any("launched fewer" in e.words() for e in moved.evidence)


def test_crossing_counts_name_no_one() -> None:
    ranks = (
        ras_rank(0, 40100, 100),
        dataclasses.replace(ras_rank(1, 40101, 99), collectives=(("AllGather", 3), ("AllReduce", 99))),
        ras_rank(2, 40102),
        ras_rank(3, 40103),
    )
    diagnosis = analyse(with_ras(all_waiting(), RasCommunicator("0xa", 4, ranks)))
    assert diagnosis.verdict is Verdict.NCCL_TIMEOUT and diagnosis.culprit_ranks == ()
    assert not any("launched fewer" in e.words() for e in diagnosis.evidence)


def test_nccl_errors_and_aborts_are_evidence() -> None:
    ranks = tuple(ras_rank(r, 40100 + r, async_error=6 if r == 1 else 0, abort_flag=r == 1) for r in range(4))
    diagnosis = analyse(with_ras(all_waiting(), RasCommunicator("0xa", 4, ranks)))
    assert ("NCCL RAS 2.28.9: communicator 0xa (4 ranks): rank 1 reports NCCL error 6 (remote process error)") in said(
        diagnosis
    )
    assert "NCCL RAS 2.28.9: communicator 0xa (4 ranks): rank 1 aborted the communicator" in said(diagnosis)


# ------------------------------------------------------------------ communicator ranks -> global ranks


def test_a_subgroup_s_ranks_are_named_by_their_pids() -> None:
    snap = all_waiting()
    comm = RasCommunicator("0xb", 2, (ras_rank(0, 40102), ras_rank(1, 40103)))
    assert global_ranks(snap, comm) == {0: 2, 1: 3}


def test_a_world_sized_communicator_s_ranks_are_the_global_ranks() -> None:
    snap = all_waiting()
    comm = RasCommunicator("0xc", 4, tuple(ras_rank(r, 7000 + r) for r in range(4)))  # pids of another namespace
    assert global_ranks(snap, comm) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_a_pid_that_contradicts_the_world_rule_wins_and_the_rest_stay_unnamed() -> None:
    snap = all_waiting()
    comm = RasCommunicator("0xd", 4, (ras_rank(0, 40101), ras_rank(1, 7001), ras_rank(2, 7002), ras_rank(3, 7003)))
    assert global_ranks(snap, comm) == {0: 1}
    gone = RasCommunicator(
        "0xd",
        4,
        (ras_rank(0, 40101), dataclasses.replace(ras_rank(1, 7001), missing=True, unresponsive=True, collectives=())),
    )
    diagnosis = analyse(with_ras(snap, gone))
    assert diagnosis.culprit_ranks == ()  # the unreachable one cannot be named
    assert (
        "NCCL RAS 2.28.9: communicator 0xd (4 ranks) cannot reach communicator rank 1 (pid 7001 on 10.0.0.11)"
    ) in said(diagnosis)


def test_a_pid_two_ranks_share_names_no_one() -> None:
    twins = make_snapshot(
        [
            make_rank(0, ALL_REDUCE, pid=5, host="a"),
            make_rank(1, ALL_REDUCE, pid=5, host="b"),
            make_rank(2, ALL_REDUCE, pid=6),
        ],
        world_size=3,
    )
    comm = RasCommunicator("0xe", 2, (ras_rank(0, 5), ras_rank(1, 6)))
    assert global_ranks(twins, comm) == {1: 2}


def test_the_rank_snapshot_default_keeps_no_gpus() -> None:
    assert RankSnapshot.__dataclass_fields__["gpus"].default == ()
