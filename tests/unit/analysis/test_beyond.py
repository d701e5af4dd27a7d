"""The wait past the ranks, from snapshots built by hand: which ranks capture follows
(``needs_waits``), the chain each rank's wait makes through the processes followed, the
root cause and ``external_wait``, and where none of it may fire (recorded real captures:
``test_beyond_recorded.py``)."""

from __future__ import annotations

import dataclasses

from support.factories import make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.beyond import needs_waits
from hangdoc.model import (
    LinkKind,
    RankSnapshot,
    RankState,
    ThreadWait,
    Verdict,
    WaitKind,
)
from hangdoc.report.json_report import to_json_dict

READ = ["train.py:<module>:90", "train.py:main:60", "train.py:request_rollouts:52", "socket.py:SocketIO.readinto:706"]
BROADCAST = ["train.py:<module>:90", "train.py:main:70", "torch/distributed/distributed_c10d.py:broadcast:2800"]
LOCKED = ["server.py:Scheduler.run:40", "server.py:KVCache.evict:77"]
IDLE_LOOP = ["server.py:<module>:120", "selectors.py:EpollSelector.select:468"]
SERVER = 812


def _waiting(snap: RankSnapshot, *waits: ThreadWait) -> RankSnapshot:
    """``snap`` with ``waits`` read with its last sample."""
    last = dataclasses.replace(snap.samples[-1], waits=waits)
    return dataclasses.replace(snap, samples=(*snap.samples[:-1], last))


def _socket(native_id: int, peers: tuple[int, ...] = (SERVER,), remote: str = "") -> ThreadWait:
    return ThreadWait(native_id, "recvfrom", WaitKind.SOCKET, 5, "socket:[77]", peers, remote)


def _server(*, stacks_move: bool = False, locked: bool = True, pid: int = SERVER) -> RankSnapshot:
    """A server: its main thread idle on its listening socket, a 'scheduler' thread on a lock."""
    scheduler = ["server.py:Scheduler.run:40", "server.py:Scheduler.step:33"] if not locked else LOCKED
    code = {77: "with self.lock:"}
    snap = make_rank(
        None,
        IDLE_LOOP,
        pid=pid,
        samples=2,
        rank_source=None,
        cmdline=("python", "server.py", "--serve"),
        threads={"scheduler": scheduler},
        stacks=[IDLE_LOOP, [*IDLE_LOOP, "selectors.py:x:1"]] if stacks_move else None,
    )
    scheduler_id = pid + 100
    frames = []
    for sample in snap.samples:
        threads = tuple(
            dataclasses.replace(
                t,
                frames=tuple(dataclasses.replace(f, code=code.get(f.line or 0)) for f in t.frames),
            )
            for t in sample.threads
        )
        frames.append(
            dataclasses.replace(
                sample,
                threads=threads,
                waits=(
                    ThreadWait(pid, "epoll_wait", WaitKind.LISTEN, 3, "socket:[1]"),
                    ThreadWait(scheduler_id, "futex", WaitKind.THREAD),
                ),
            )
        )
    return dataclasses.replace(snap, samples=tuple(frames))


def _job(rank0: RankSnapshot, others: dict[int, list[str]], beyond: tuple[RankSnapshot, ...], **kw: object):
    ranks = [rank0, *(make_rank(r, s) for r, s in others.items())]
    return dataclasses.replace(make_snapshot(ranks, **kw), beyond=beyond)  # type: ignore[arg-type]


def test_a_straggler_reading_from_a_server_names_the_servers_locked_thread() -> None:
    rank0 = _waiting(make_rank(0, READ), _socket(1000))
    diagnosis = analyse(_job(rank0, {1: BROADCAST, 2: BROADCAST}, (_server(),)))
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (0,)
    root = diagnosis.root_cause
    assert root is not None and root.pid == SERVER and root.rank is None and root.thread == "scheduler"
    assert root.frame is not None and root.frame.line == 77 and not root.cycle
    kinds = [link.waits for link in root.chain]
    assert kinds == [LinkKind.COLLECTIVE, LinkKind.SOCKET, LinkKind.LOCK]
    assert [link.rank for link in root.chain] == [1, 0, None]
    assert root.chain[1].on == f"pid {SERVER}"
    said = [e.words() for e in diagnosis.evidence]
    assert any(f"the wait ends at pid {SERVER} (python server.py --serve), thread 'scheduler'" in e for e in said)
    assert diagnosis.next_steps[0].startswith(f"The hang is held by pid {SERVER}")
    assert f"py-spy dump --pid {SERVER}" in diagnosis.next_steps[0]
    report = to_json_dict(diagnosis, _job(rank0, {1: BROADCAST, 2: BROADCAST}, (_server(),)))
    assert report["root_cause"]["pid"] == SERVER and report["root_cause"]["chain"][1]["waits"] == "socket"
    assert report["root_cause"]["frame"].endswith("server.py:77")


def test_every_rank_waiting_on_a_server_is_an_external_wait() -> None:
    ranks = [_waiting(make_rank(r, READ), _socket(1000 + r)) for r in (0, 1)]
    snapshot = dataclasses.replace(make_snapshot(ranks), beyond=(_server(),))
    diagnosis = analyse(snapshot)
    assert diagnosis.verdict is Verdict.EXTERNAL_WAIT and diagnosis.culprit_ranks == (0, 1)
    assert diagnosis.root_cause is not None and diagnosis.root_cause.pid == SERVER
    assert diagnosis.summary.startswith("External wait: ranks 0-1 wait outside torch.distributed, on pid 812")
    assert [e.words() for e in diagnosis.evidence][:2] == [
        f"rank 0 waits on a socket to pid {SERVER}",
        f"rank 1 waits on a socket to pid {SERVER}",
    ]


def test_over_part_of_the_job_the_same_waits_are_unknown_with_their_root() -> None:
    ranks = [_waiting(make_rank(r, READ), _socket(1000 + r)) for r in (0, 1)]
    snapshot = dataclasses.replace(make_snapshot(ranks, world_size=4, spec="pid:1000"), beyond=(_server(),))
    diagnosis = analyse(snapshot)
    assert diagnosis.verdict is Verdict.UNKNOWN and diagnosis.culprit_ranks == ()
    assert "not seen, so whether the job waits there is not known" in diagnosis.summary
    assert diagnosis.root_cause is not None and diagnosis.root_cause.pid == SERVER


def test_without_waits_nothing_changes() -> None:
    """A capture that read no wait (dumps, an older agent): the rules as before, no root."""
    diagnosis = analyse(make_snapshot({0: READ, 1: BROADCAST}))
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.root_cause is None
    blocked = analyse(make_snapshot({0: READ, 1: READ}))
    assert blocked.verdict is Verdict.UNKNOWN and blocked.root_cause is None


def test_a_wait_on_another_rank_does_not_leave_the_ranks() -> None:
    ranks = [_waiting(make_rank(0, READ), _socket(1000, peers=(1001,))), make_rank(1, READ)]
    diagnosis = analyse(make_snapshot(ranks))
    assert diagnosis.verdict is Verdict.UNKNOWN and diagnosis.root_cause is None


def test_a_process_whose_stack_moves_is_the_end_and_runs() -> None:
    rank0 = _waiting(make_rank(0, READ), _socket(1000))
    diagnosis = analyse(_job(rank0, {1: BROADCAST}, (_server(stacks_move=True),)))
    root = diagnosis.root_cause
    assert root is not None and root.pid == SERVER and root.chain[-1].waits is None
    assert root.how[-1] == "its stack changed between two samples: it runs"


def test_a_process_with_only_idle_threads_ends_the_chain_without_a_thread() -> None:
    rank0 = _waiting(make_rank(0, READ), _socket(1000))
    idle = _server()
    idle = dataclasses.replace(
        idle,
        samples=tuple(
            dataclasses.replace(s, waits=(ThreadWait(SERVER, "accept4", WaitKind.LISTEN, 3, "socket:[1]"),))
            for s in idle.samples
        ),
    )
    idle = dataclasses.replace(idle, samples=tuple(dataclasses.replace(s, threads=s.threads[:1]) for s in idle.samples))
    diagnosis = analyse(_job(rank0, {1: BROADCAST}, (idle,)))
    root = diagnosis.root_cause
    assert root is not None and root.pid == SERVER and root.thread is None
    assert root.how[-1] == "none of its threads holds anything: each waits for work to come"


def test_a_file_lock_cycle_through_a_helper_is_a_deadlock_across_processes() -> None:
    flocked = ["train.py:<module>:90", "train.py:main:60", "cache.py:append:97", "cache.py:flocked:39"]
    rank0 = _waiting(
        make_rank(0, flocked), ThreadWait(1000, "flock", WaitKind.FILE_LOCK, 4, "/tmp/shard.lock", (SERVER,))
    )
    helper = make_rank(None, ["compact.py:compact:67", "cache.py:flocked:39"], pid=SERVER, samples=2, rank_source=None)
    helper = dataclasses.replace(
        helper,
        samples=tuple(
            dataclasses.replace(
                s, waits=(ThreadWait(SERVER, "flock", WaitKind.FILE_LOCK, 4, "/tmp/index.lock", (1000,)),)
            )
            for s in helper.samples
        ),
    )
    diagnosis = analyse(_job(rank0, {1: BROADCAST}, (helper,)))
    root = diagnosis.root_cause
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (0,)
    assert not diagnosis.ambiguous  # a cycle does not end by waiting longer
    assert root is not None and root.cycle and root.pid == SERVER
    assert root.chain[-1].on == "rank 0 (pid 1000)" and root.chain[-1].waits is LinkKind.FILE_LOCK
    assert "take the locks or resources in one order" in diagnosis.next_steps[0]


def test_an_address_off_the_node_ends_the_chain_at_the_rank() -> None:
    remote = _socket(1000, peers=(), remote="10.0.0.7:8000")
    ranks = [_waiting(make_rank(r, READ), dataclasses.replace(remote, native_id=1000 + r)) for r in (0, 1)]
    diagnosis = analyse(make_snapshot(ranks))
    assert diagnosis.verdict is Verdict.EXTERNAL_WAIT
    root = diagnosis.root_cause
    assert root is not None and root.rank == 0 and root.chain[-1].on == "10.0.0.7:8000"


def test_a_healthy_job_has_no_root_cause() -> None:
    moving = make_rank(0, READ, stacks=[READ, BROADCAST, READ])
    ranks = [_waiting(moving, _socket(1000)), make_rank(1, BROADCAST, stacks=[BROADCAST, READ, BROADCAST])]
    diagnosis = analyse(dataclasses.replace(make_snapshot(ranks), beyond=(_server(),)))
    assert diagnosis.verdict is Verdict.NOT_HUNG and diagnosis.root_cause is None


# ------------------------------------------------------------------ needs_waits


def _code(_frame: object) -> None:
    return None


def test_capture_follows_only_ranks_off_cpu_outside_any_op() -> None:
    blocked = make_rank(0, READ, threads={"feeder": ["threading.py:Condition.wait:320"]})
    assert needs_waits(blocked.samples, blocked.process, _code) == {1000, 1100}
    in_op = make_rank(1, BROADCAST)
    assert needs_waits(in_op.samples, in_op.process, _code) == frozenset()
    busy = make_rank(2, READ, active=True)
    assert needs_waits(busy.samples, busy.process, _code) == frozenset()
    moved = make_rank(3, READ, stacks=[BROADCAST, READ])
    assert needs_waits(moved.samples, moved.process, _code) == frozenset()
    assert needs_waits((), blocked.process, _code) == frozenset()


def test_a_blocked_rank_is_blocked_state() -> None:
    view = analyse(make_snapshot({0: READ, 1: BROADCAST})).ranks[0]
    assert view.state is RankState.BLOCKED


def test_a_queue_fed_by_a_thread_of_the_rank_ends_at_that_thread() -> None:
    """The trainer waits on a queue a rollout thread of its own fills; the rollout thread
    waits on the staleness condition: the root is that thread, in the rank (the queue's
    feeder thread, library machinery, is not it)."""
    get = ["train.py:<module>:90", "train.py:main:60", "queue.py:Queue.get:171", "threading.py:Condition.wait:327"]
    rollout = ["rollout.py:run:30", "rollout.py:wait_for_staleness:44", "threading.py:Condition.wait:327"]
    feeder = ["threading.py:Thread.run:982", "multiprocessing/queues.py:_feed:231", "threading.py:Condition.wait:327"]
    rank0 = make_rank(0, get, threads={"QueueFeederThread": feeder, "rollout": rollout})
    rank0 = _waiting(rank0, *(ThreadWait(n, "futex", WaitKind.THREAD) for n in (1000, 1100, 1200)))
    diagnosis = analyse(make_snapshot([rank0, make_rank(1, BROADCAST)]))
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.culprit_ranks == (0,)
    root = diagnosis.root_cause
    assert root is not None and root.pid == 1000 and root.rank == 0 and root.thread == "rollout"
    assert [link.waits for link in root.chain] == [LinkKind.COLLECTIVE, LinkKind.QUEUE, LinkKind.CONDITION]
    assert root.frame is not None and root.frame.line == 44


def test_a_read_that_does_not_return_ends_at_the_rank_on_its_file() -> None:
    """A rank's own read of a dead file: no other thread or process holds it, the file does."""
    reading = ["train.py:<module>:90", "train.py:main:60", "train.py:step:33"]
    rank0 = make_rank(0, reading, threads={"writer": ["writer.py:run:12", "threading.py:Condition.wait:327"]})
    rank0 = _waiting(rank0, ThreadWait(1000, "read", WaitKind.FILE, 7, "/mnt/nfs/shard.bin"))
    diagnosis = analyse(make_snapshot([rank0, make_rank(1, BROADCAST)]))
    root = diagnosis.root_cause
    assert diagnosis.verdict is Verdict.STRAGGLER and root is not None
    assert root.pid == 1000 and root.thread == "MainThread" and root.chain[-1].on == "/mnt/nfs/shard.bin"
    assert root.how[-1] == "read on /mnt/nfs/shard.bin does not return"


def test_a_rank_waiting_on_its_own_lock_is_left_to_the_lock_analysis() -> None:
    locked = ["train.py:<module>:90", "train.py:main:60", "train.py:step:33"]
    rank0 = make_rank(0, locked, threads={"writer": ["writer.py:run:12", "threading.py:Condition.wait:327"]})
    rank0 = _waiting(rank0, ThreadWait(1000, "futex", WaitKind.THREAD), ThreadWait(1100, "futex", WaitKind.THREAD))
    lock_line = dataclasses.replace(rank0.samples[-1].threads[0].frames[-1], code="with self.lock:")
    main = dataclasses.replace(
        rank0.samples[-1].threads[0], frames=(*rank0.samples[-1].threads[0].frames[:-1], lock_line)
    )
    last = dataclasses.replace(rank0.samples[-1], threads=(main, *rank0.samples[-1].threads[1:]))
    rank0 = dataclasses.replace(rank0, samples=(*rank0.samples[:-1], last))
    diagnosis = analyse(make_snapshot([rank0, make_rank(1, BROADCAST)]))
    assert diagnosis.verdict is Verdict.STRAGGLER and diagnosis.root_cause is None


def test_a_server_on_another_node_is_the_root_through_its_agent() -> None:
    """A TCP connection off the rank's node whose far end that node's agent named."""
    wait = ThreadWait(1000, "recvfrom", WaitKind.SOCKET, 5, "socket:[77]", (SERVER,), "10.0.0.2:8000", "", "node-b")
    rank0 = _waiting(make_rank(0, READ, host="node-a"), wait)
    server = _server()
    server = dataclasses.replace(server, process=dataclasses.replace(server.process, host="node-b"))
    local_twin = make_rank(None, IDLE_LOOP, pid=SERVER, host="node-a", rank_source=None)  # same pid, other node
    ranks = [rank0, make_rank(1, BROADCAST, host="node-a")]
    snapshot = dataclasses.replace(make_snapshot(ranks), beyond=(local_twin, server))
    diagnosis = analyse(snapshot)
    root = diagnosis.root_cause
    assert diagnosis.verdict is Verdict.STRAGGLER and root is not None
    assert (root.pid, root.host, root.thread) == (SERVER, "node-b", "scheduler")
    assert root.chain[1].on == f"pid {SERVER} on node-b" and "the agent on node-b names" in root.how[1]


def test_an_external_wait_on_a_process_that_runs_is_watched_longer_and_less_sure() -> None:
    """Ranks that wait on a process that works (slow data loading) look stuck for a while."""
    ranks = [_waiting(make_rank(r, READ), _socket(1000 + r)) for r in (0, 1)]
    snapshot = dataclasses.replace(make_snapshot(ranks), beyond=(_server(stacks_move=True),))
    diagnosis = analyse(snapshot)
    assert diagnosis.verdict is Verdict.EXTERNAL_WAIT and diagnosis.ambiguous
    assert diagnosis.confidence.value == "medium"
    assert any("which runs: slow work or a loop" in b for b in diagnosis.basis), diagnosis.basis
    still = analyse(dataclasses.replace(snapshot, beyond=(_server(),)))
    assert not still.ambiguous and still.confidence.value == "high"
    assert f"each rank's wait followed past the ranks, to pid {SERVER}" in still.basis
