"""What the call's own arguments say (py-spy ``--locals`` of torch.distributed frames, cleaned
on the node): the process group an op runs on, the peer of a p2p call as a global rank,
and the rank and world size a job's code passed to ``init_process_group``."""

from __future__ import annotations

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import TESTS
from support.stacks import main_thread

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import init_arguments, recognise
from hangdoc.capture.read.pyspy import parse_dump
from hangdoc.model import GIVEN_GROUP, WORLD_GROUP, RankSource, RankState, Verdict

C10D = "torch/distributed/distributed_c10d.py"
WRAPPER = "torch/distributed/c10d_logger.py:_exception_logger.<locals>.wrapper:83"


@pytest.mark.parametrize(
    ("name", "op", "group", "peer"),
    [
        # real dumps of one hung gloo job: all_reduce(group=sub), send(dst=2), all_reduce(), ...
        ("pyspy_locals_subgroup_allreduce.json", "all_reduce", GIVEN_GROUP, None),
        ("pyspy_locals_world_allreduce.json", "all_reduce", WORLD_GROUP, None),
        ("pyspy_locals_send_world.json", "send", WORLD_GROUP, 2),
        ("pyspy_recv_locals.json", "recv", WORLD_GROUP, 1),
        ("pyspy_rank0_allreduce.json", "all_reduce", None, None),  # dumped without --locals
    ],
)
def test_the_group_and_peer_of_an_op_come_from_its_arguments(
    name: str, op: str, group: str | None, peer: int | None
) -> None:
    found = recognise(main_thread(parse_dump((TESTS / "data" / name).read_text())))
    assert found is not None
    assert (found.name, found.group, found.peer) == (op, group, peer)


def _p2p(rank: int, call: str, line: int, code: str, args: dict[str, str], wrapper: dict[str, str]) -> object:
    stack = ["pp.py:<module>:90", f"pp.py:stage:{line}", WRAPPER, f"{C10D}:{call}:2799"]
    snap = make_rank(rank, stack, world_size=4, arguments=[(-2, wrapper), (-1, args)])
    # the call line as the job wrote it
    frames = list(snap.samples[0].threads[0].frames)
    return snap, frames, code


def test_a_group_rank_on_the_call_line_is_not_read_as_a_global_peer() -> None:
    # recv(group_src=1, group=stage_group): 1 is a rank inside the group; without the
    # group's members the global peer is unknown, and the line's "=1" must not be taken
    stack = ["pp.py:<module>:90", "pp.py:stage:40", WRAPPER, f"{C10D}:recv:2799"]
    snap = make_rank(
        1, stack, arguments=[(-2, {"group": GIVEN_GROUP and "<ProcessGroup>"}), (-1, {"src": "None", "group_src": "1"})]
    )
    thread = snap.samples[0].threads[0]
    op = recognise(thread)
    assert op is not None and (op.group, op.peer) == (GIVEN_GROUP, None)
    # on the default group, a group rank is the global rank
    world = make_rank(1, stack, arguments=[(-2, {"group": "(default)"}), (-1, {"src": "None", "group_src": "3"})])
    op = recognise(world.samples[0].threads[0])
    assert op is not None and (op.group, op.peer) == (WORLD_GROUP, 3)


def test_peers_from_arguments_pair_up_a_p2p_deadlock() -> None:
    # ranks 1 and 3 each wait to receive from the other (src=peer, a variable on the line)
    stack = ["pp.py:<module>:90", "pp.py:backward_stage:53", WRAPPER, f"{C10D}:recv:2799"]
    ranks = [
        make_rank(r, stack, world_size=4, arguments=[(-2, {"group": "(default)"}), (-1, {"src": str(peer)})])
        for r, peer in ((1, 3), (3, 1))
    ]
    for r, line in ((0, 58), (2, 86)):
        ranks.append(
            make_rank(
                r,
                ["pp.py:<module>:90", f"pp.py:reduce_grads:{line}", WRAPPER, f"{C10D}:all_reduce:3252"],
                world_size=4,
                arguments=[(-2, {"group": "<ProcessGroup>"})],
            )
        )
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (1, 3)
    ops = {ra.rank: ra.op for ra in d.ranks}
    assert ops[1].peer == 3 and ops[3].peer == 1
    assert ops[0].group == GIVEN_GROUP


INIT = [
    "spawn.py:_wrap:80",
    "job.py:worker:39",
    WRAPPER,
    f"{C10D}:init_process_group:1600",
    "torch/distributed/rendezvous.py:_create_c10d_store:199",
]


def _spawned(index: int, world: str) -> object:
    return make_rank(
        index,
        INIT,
        rank_source=RankSource.INFERRED,
        rank_evidence=f"spawn index {index}",
        env={},
        arguments=[(3, {"rank": str(index), "world_size": world})],
    )


def test_a_world_size_given_only_in_code_names_the_ranks_that_never_started() -> None:
    snap = make_snapshot([_spawned(0, "4"), _spawned(1, "4")], world_size=0)
    assert init_arguments(snap.ranks[0].samples[0].threads[0]) == (0, 4)
    d = analyse(snap)
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (2, 3)
    assert {ra.rank: ra.state for ra in d.ranks}[3] is RankState.MISSING


def test_minus_one_means_the_environment_and_names_no_world() -> None:
    # init_process_group(world_size=-1): torch reads WORLD_SIZE; nothing to learn here
    snap = make_snapshot([_spawned(0, "-1"), _spawned(1, "-1")], world_size=0)
    assert init_arguments(snap.ranks[0].samples[0].threads[0]) == (0, None)
    d = analyse(snap)
    assert d.verdict is Verdict.INIT_DEADLOCK
    assert d.culprit_ranks == ()


def test_the_code_s_rank_number_wins_over_a_guessed_one_but_not_over_the_environment() -> None:
    # spawn order said 0, the code says 2 (a launcher that offsets its workers)
    guessed = make_rank(
        0, INIT, rank_source=RankSource.INFERRED, env={}, arguments=[(3, {"rank": "2", "world_size": "3"})]
    )
    from_env = make_rank(1, INIT, arguments=[(3, {"rank": "0", "world_size": "3"})])
    d = analyse(make_snapshot([guessed, from_env], world_size=0))
    assert sorted(ra.rank for ra in d.ranks if ra.state is not RankState.MISSING) == [1, 2]
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (0,)


def test_a_rank_that_exits_after_being_seen_is_missing_not_waiting() -> None:
    wait = ["train.py:<module>:200", "train.py:main:150", f"{C10D}:all_reduce:2800"]
    ranks = [make_rank(r, wait, world_size=3) for r in (0, 1)]
    ranks.append(make_rank(2, wait, world_size=3, gone_after=1))
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (2,)
    assert {ra.rank: ra.state for ra in d.ranks}[2] is RankState.EXITED


def test_a_minority_on_the_default_group_stays_the_culprit_beside_an_unpaired_receive() -> None:
    # the other side: rank 3 alone in recv from 0 while ranks 0-2 are in a WORLD all_reduce;
    # rank 0 does not pair with it, but rank 3 is the one that left the common path
    world = [
        make_rank(
            r,
            ["train.py:<module>:200", "train.py:main:150", WRAPPER, f"{C10D}:all_reduce:3252"],
            world_size=4,
            arguments=[(-2, {"group": "(default)"})],
        )
        for r in (0, 1, 2)
    ]
    recv = make_rank(
        3,
        ["train.py:<module>:200", "train.py:main:170", WRAPPER, f"{C10D}:recv:2799"],
        world_size=4,
        arguments=[(-2, {"group": "(default)"}), (-1, {"src": "0"})],
    )
    d = analyse(make_snapshot([*world, recv]))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (3,)


DDP = "torch/nn/parallel/distributed.py"


def test_a_lock_inside_a_ddp_wrapped_forward_is_the_job_blocking_not_ddp() -> None:
    # rank 1's model forward (run by DDP's forward) waits on a lock: a straggler, not DDP
    forward = [
        "train.py:<module>:200",
        "train.py:main:150",
        f"{DDP}:DistributedDataParallel.forward:1644",
        f"{DDP}:DistributedDataParallel._run_ddp_forward:1460",
        "model.py:Net.forward:33",
        "cache.py:Cache.get:12",
        "threading.py:Lock.acquire:88",
    ]
    thread = make_rank(1, forward).samples[0].threads[0]
    assert recognise(thread) is None
    waiting = [
        make_rank(r, ["train.py:<module>:200", "train.py:main:160", f"{C10D}:all_reduce:2800"], world_size=3)
        for r in (0, 2)
    ]
    d = analyse(make_snapshot([waiting[0], make_rank(1, forward, world_size=3), waiting[1]]))
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (1,)


def test_ddp_s_own_code_blocking_in_its_forward_is_its_sync() -> None:
    # nothing but torch inside DDP's forward, no native frames: DDP's own sync blocks
    sync = [
        "train.py:<module>:200",
        "train.py:main:150",
        f"{DDP}:DistributedDataParallel.forward:1644",
        f"{DDP}:DistributedDataParallel._pre_forward:1520",
    ]
    op = recognise(make_rank(1, sync).samples[0].threads[0])
    assert op is not None and op.name == "all_reduce" and op.via.startswith("DDP")
