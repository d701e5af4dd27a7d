"""From one part of a job to the whole: ``pid:`` of a rank widens to its job on this node,
a launcher that is itself rank 0 is a rank, and the job's other nodes are named with the
command lines that take them in (hand-built process tables)."""

from __future__ import annotations

import pytest
from support.tables import PY, SPAWN, TORCHRUN, TRACKER, proc, table

from hangdoc.capture.find import wholejob
from hangdoc.capture.find.discover import MultipleJobs, discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.find.processes import ProcInfo
from hangdoc.capture.find.rankselect import select_ranks
from hangdoc.capture.find.wholejob import _expand_nodelist, elsewhere, elsewhere_note
from hangdoc.model import Note, NoteKind, RankSource

HOST = "node0"


def endpoint(port: int = 29500, addr: str = "127.0.0.1", **more: str) -> dict[str, str]:
    return {"MASTER_ADDR": addr, "MASTER_PORT": str(port), **more}


def torchrun_job(world: int = 3, port: int = 29500, uid: int | None = None) -> list[ProcInfo]:
    procs = [proc(10, 1, ("/bin/bash",), uid=uid), proc(11, 10, TORCHRUN, {}, uid=uid)]
    for rank in range(world):
        procs.append(
            proc(
                12 + rank,
                11,
                (PY, "train.py"),
                endpoint(
                    port, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
                ),
                uid=uid,
            )
        )
    procs.append(proc(30, 12, (PY, "train.py"), dict(procs[2].env or {}), uid=uid))  # a worker
    return procs


def found(spec: str, *procs: ProcInfo) -> tuple[list[tuple[int | None, int]], int | None, list[Note]]:
    """The ranks, world size and notes of ``spec`` found on this node alone (the note on
    other nodes as the fleet makes it for one local node)."""
    d = discover(parse_job_spec(spec), host=HOST, table=table(*procs))
    notes = list(d.notes)
    if d.elsewhere is not None and (
        note := elsewhere_note([d.elsewhere], [r.rank for r in d.ranks], d.world_size, [HOST], spec, agents=False)
    ):
        notes.append(Note(note))
    return [(r.rank, r.pid) for r in d.ranks], d.world_size, notes


# ------------------------------------------------------------------ pid: of one rank


def test_pid_of_a_torchrun_worker_takes_in_its_job_and_says_so() -> None:
    ranks, world, notes = found("pid:13", *torchrun_job())
    assert ranks == [(0, 12), (1, 13), (2, 14)] and world == 3
    widened = Note("pid 13 is rank 1 of the job at 127.0.0.1:29500; took in its 3 ranks on this node", NoteKind.WIDENED)
    assert widened in notes
    assert not any("is one rank" in n.words() for n in notes)
    assert any("30 (child of rank 0" in n.words() for n in notes)  # rank 0's worker, still no rank
    assert [n.pids for n in notes if n.kind is NoteKind.NOT_RANKS] == [(30,)]


def test_pid_of_a_directly_started_rank_takes_in_the_ranks_of_its_rendezvous() -> None:
    procs = [proc(20 + r, 5, (PY, "train.py"), endpoint(RANK=str(r), WORLD_SIZE="3")) for r in range(3)]
    procs.append(proc(5, 1, ("/bin/bash",)))
    procs.append(proc(40, 1, (PY, "other.py"), endpoint(29501, RANK="0", WORLD_SIZE="1")))
    d = discover(parse_job_spec("pid:22"), host=HOST, table=table(*procs))
    assert [r.pid for r in d.ranks] == [20, 21, 22]  # not the job at port 29501
    assert "widened to the job at 127.0.0.1:29500" in d.searched


def test_other_names_of_this_host_are_one_rendezvous() -> None:
    procs = [
        proc(20, 1, (PY, "t.py"), endpoint(addr="localhost", RANK="0", WORLD_SIZE="2")),
        proc(21, 1, (PY, "t.py"), endpoint(addr="127.0.0.1", RANK="1", WORLD_SIZE="2")),
    ]
    ranks, _, _ = found("pid:21", *procs)
    assert ranks == [(0, 20), (1, 21)]


def test_pid_of_a_spawn_child_gets_its_place_among_all_its_siblings() -> None:
    master = endpoint()
    procs = [
        proc(40, 1, (PY, "train.py"), master, t=1.0),
        proc(41, 40, TRACKER, master, t=2.0),
        proc(42, 40, SPAWN, master, t=3.0),
        proc(43, 40, SPAWN, master, t=3.1),
        proc(44, 40, SPAWN, master, t=3.2),
    ]
    narrow = select_ranks(table(*procs), [43])
    assert [(r.proc.pid, r.rank) for r in narrow.ranks] == [(43, 0)]  # alone: no place
    ranks, world, notes = found("pid:43", *procs)
    assert ranks == [(0, 42), (1, 43), (2, 44)] and world == 3
    assert (
        Note("pid 43 is rank 1 of the job at 127.0.0.1:29500; took in its 3 ranks on this node", NoteKind.WIDENED)
        in notes
    )


def test_spawn_children_without_a_rendezvous_widen_to_their_parent() -> None:
    procs = [proc(40, 1, (PY, "train.py"), {}, t=1.0), proc(42, 40, SPAWN, {}, t=3.0), proc(43, 40, SPAWN, {}, t=3.1)]
    ranks, _, notes = found("pid:43", *procs)
    assert ranks == [(0, 42), (1, 43)]
    assert Note("pid 43 is rank 1 of the job of pid 40; took in its 2 ranks on this node", NoteKind.WIDENED) in notes


def test_pid_of_a_slurm_task_takes_in_its_step_only() -> None:
    def step(launcher: int, step_id: str) -> list[ProcInfo]:
        env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": step_id, "SLURM_NTASKS": "2"}
        return [proc(launcher, 1, ("/usr/sbin/slurmstepd", f"[77.{step_id}]"), env)] + [
            proc(launcher + 1 + r, launcher, (PY, "train.py"), {**env, "SLURM_PROCID": str(r)}) for r in (0, 1)
        ]

    ranks, _, notes = found("pid:42", *step(30, "0"), *step(40, "1"))
    assert ranks == [(0, 41), (1, 42)]
    assert Note("pid 42 is rank 1 of the job slurm:77.1; took in its 2 ranks on this node", NoteKind.WIDENED) in notes


def test_another_users_process_in_the_rendezvous_is_not_taken_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wholejob, "listening_uids", lambda port: set())  # no store listens here
    procs = torchrun_job(uid=1000)
    procs.append(proc(90, 1, (PY, "fake.py"), endpoint(RANK="1", WORLD_SIZE="3"), uid=1001))
    ranks, _, notes = found("pid:13", *procs)
    assert [pid for _, pid in ranks] == [12, 13, 14]
    assert (
        "pid 13 is rank 1 of the job at 127.0.0.1:29500; took in its 3 ranks on this node, "
        "not 1 process of other users that name its rendezvous (pid 90 (uid 1001))"
    ) in [n.words() for n in notes]


def test_a_process_in_a_rendezvous_another_user_listens_on_is_not_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wholejob, "listening_uids", lambda port: {0} if port == 29500 else set())
    procs = torchrun_job(uid=0)
    procs.append(proc(90, 1, (PY, "squat.py"), endpoint(RANK="1", WORLD_SIZE="3"), uid=1001))
    procs.append(proc(91, 1, (PY, "squat.py"), endpoint(RANK="2", WORLD_SIZE="3"), uid=1001))
    ranks, _, notes = found("pid:90", *procs)
    assert ranks == [(1, 90)]  # root's ranks are not the squatter's to diagnose
    assert notes[0] == Note("pid 90 is one rank; to see the whole job name it by 127.0.0.1:29500", NoteKind.WIDENED)


def test_pid_of_a_lone_rank_keeps_the_endpoint_note() -> None:
    only = proc(12, 1, (PY, "train.py"), endpoint(RANK="0", WORLD_SIZE="1"))
    ranks, _, notes = found("pid:12", only)
    assert ranks == [(0, 12)]
    assert notes == [Note("pid 12 is one rank; to see the whole job name it by 127.0.0.1:29500", NoteKind.WIDENED)]


def test_pid_of_a_launcher_is_not_widened_when_it_holds_the_whole_job() -> None:
    ranks, _, notes = found("pid:11", *torchrun_job())
    assert [r for r, _ in ranks] == [0, 1, 2]
    assert not any("took in" in n.words() for n in notes)
    assert not any(n.kind is NoteKind.WIDENED for n in notes)


def test_pid_of_a_shell_with_two_jobs_is_still_refused() -> None:
    procs = [proc(10, 1, ("/bin/bash",))]
    for launcher, port in ((11, 29500), (21, 29501)):
        procs.append(proc(launcher, 10, TORCHRUN, {}))
        procs += [proc(launcher + 1 + r, launcher, (PY, "t.py"), endpoint(port, RANK=str(r))) for r in (0, 1)]
    with pytest.raises(MultipleJobs):
        discover(parse_job_spec("pid:10"), table=table(*procs))
    ranks, _, _ = found("pid:23", *procs)  # a rank of the second job: that job alone
    assert ranks == [(0, 22), (1, 23)]


# ------------------------------------------------------------------ a launcher that is rank 0


def launcher_is_rank0(parent_env: dict[str, str] | None = None) -> list[ProcInfo]:
    """A script that starts its other ranks with LOCAL_RANK 1, 2 and joins them as rank 0."""
    cmd = (PY, "serve_and_train.py")
    env = parent_env if parent_env is not None else endpoint()
    child = endpoint(WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
    return [
        proc(5, 1, ("/bin/bash",)),
        proc(50, 5, cmd, env, t=1.0),
        proc(51, 50, cmd, {**child, "LOCAL_RANK": "1"}, t=2.0),
        proc(52, 50, cmd, {**child, "LOCAL_RANK": "2"}, t=2.0),
        proc(53, 50, cmd, env, t=3.0),  # rank 0's DataLoader worker (a fork)
        proc(54, 51, cmd, {**child, "LOCAL_RANK": "1"}, t=4.0),
    ]  # rank 1's worker


@pytest.mark.parametrize("spec", ["pid:50", "pid:51", "pid:52", "127.0.0.1:29500"])
def test_a_launcher_that_is_rank_0_is_found_whatever_names_the_job(spec: str) -> None:
    d = discover(parse_job_spec(spec), host=HOST, table=table(*launcher_is_rank0()))
    assert [(r.rank, r.pid, r.local_rank) for r in d.ranks] == [(0, 50, 0), (1, 51, 1), (2, 52, 2)]
    assert d.world_size == 3  # WORLD_SIZE, not the 2 children counted
    assert {r.rank_source for r in d.ranks} == {RankSource.INFERRED}
    assert d.ranks[0].rank_evidence == (
        "inferred: local rank 0: it started local ranks 1, 2 and shares their rendezvous"
    )
    assert d.ranks[1].rank_evidence == "inferred: LOCAL_RANK=1 (no rank in its start-up environment)"
    notes = " | ".join(n.words() for n in d.notes)
    assert "pid 50 started the others and shares their rendezvous: it is local rank 0" in notes
    assert "53 (child of rank 0 (pid 50))" in notes and "54 (child of rank 1 (pid 51))" in notes
    assert [sorted(n.pids) for n in d.notes if n.kind is NoteKind.NOT_RANKS] == [[53, 54]]
    assert [n.pids for n in d.notes if n.kind is NoteKind.LOCAL_RANKS] == [(50, 51, 52)]


def test_a_parent_outside_the_rendezvous_stays_a_launcher() -> None:
    d = discover(parse_job_spec("127.0.0.1:29500"), host=HOST, table=table(*launcher_is_rank0(parent_env={})))
    assert [(r.rank, r.pid) for r in d.ranks] == [(1, 51), (2, 52)]
    assert d.world_size == 3


def test_a_parent_of_ranks_numbered_from_0_is_a_launcher() -> None:
    cmd = (PY, "launch.py")
    child = endpoint(WORLD_SIZE="2")
    tab = table(
        proc(50, 1, cmd, endpoint()),
        proc(51, 50, cmd, {**child, "LOCAL_RANK": "0"}),
        proc(52, 50, cmd, {**child, "LOCAL_RANK": "1"}),
    )
    selection = select_ranks(tab, list(tab.procs))
    assert [(r.proc.pid, r.rank) for r in selection.ranks] == [(51, 0), (52, 1)]
    assert 50 in selection.launchers


def test_local_ranks_on_a_later_node_are_offset_by_the_node() -> None:
    env = endpoint(addr="10.0.0.1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", GROUP_RANK="1")
    tab = table(
        proc(5, 1, ("/bin/bash",)),
        proc(60, 5, (PY, "t.py"), {**env, "LOCAL_RANK": "0"}),
        proc(61, 5, (PY, "t.py"), {**env, "LOCAL_RANK": "1"}),
    )
    selection = select_ranks(tab, [60, 61])
    assert [(r.rank, r.local_rank) for r in selection.ranks] == [(2, 0), (3, 1)]


# ------------------------------------------------------------------ the other nodes


def test_ranks_of_a_multi_node_torchrun_job_say_how_to_take_in_the_others() -> None:
    env = endpoint(addr="10.0.0.1", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", GROUP_RANK="0", GROUP_WORLD_SIZE="2")
    procs = [proc(11, 1, TORCHRUN, {})] + [
        proc(12 + r, 11, (PY, "train.py"), {**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(4)
    ]
    _, world, notes = found("pid:13", *procs)
    assert world == 8
    assert notes[-1].words() == (
        "ranks 0-3 of 8 are on this node (node0) and LOCAL_WORLD_SIZE=4 of WORLD_SIZE=8: the "
        "others run on other nodes (10.0.0.1), not searched here. To take them in, run "
        "`hangdoc agent --listen 0.0.0.0:7420 --token-file FILE` on every node of the job, "
        "this one too, then `hangdoc diagnose 10.0.0.1:29500 --agents node0:7420,10.0.0.1:7420 "
        "--token-file FILE` (or --hostfile FILE, one agent a line)"
    )


def test_slurm_nodes_are_named_from_the_node_list() -> None:
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    procs = [proc(30, 1, ("/usr/sbin/slurmstepd", "[9.0]"), env)] + [
        proc(31 + r, 30, (PY, "t.py"), {**env, "SLURM_PROCID": str(r)}) for r in (0, 1)
    ]
    d = discover(parse_job_spec("slurm:9.0"), host="gpu07", table=table(*procs))
    assert d.elsewhere is not None and d.elsewhere.nodes == ("gpu08",)
    note = elsewhere_note([d.elsewhere], [0, 1], 4, ["gpu07"], "slurm:9.0", agents=False)
    assert note is not None and "ranks 0-1 of 4 are on this node (gpu07) and SLURM_NNODES=2" in note
    assert "`hangdoc diagnose slurm:9.0 --agents gpu07:7420,gpu08:7420 --token-file FILE`" in note


def test_a_single_node_job_with_ranks_missing_names_no_other_node() -> None:
    env = endpoint(WORLD_SIZE="4", LOCAL_WORLD_SIZE="4")
    procs = [proc(20 + r, 1, (PY, "t.py"), {**env, "RANK": str(r)}) for r in range(3)]
    _, world, notes = found("127.0.0.1:29500", *procs)
    assert world == 4 and not any("other nodes" in n.words() for n in notes)


def test_without_a_named_node_the_command_line_shows_where_they_go() -> None:
    env = {"WORLD_SIZE": "4", "NNODES": "2", "RANK": "0"}
    selection = select_ranks(table(proc(20, 1, (PY, "t.py"), env)), [20])
    there = elsewhere(selection.ranks, 4, HOST)
    assert there is not None and there.job is None
    note = elsewhere_note([there], [0], 4, [HOST], "pid:20", agents=False)
    assert note is not None
    assert "rank 0 of 4 are on this node (node0) and NNODES=2" in note
    assert "`hangdoc diagnose HOST:PORT --agents node0:7420,NODE:7420,... --token-file FILE`" in note


def test_the_nodes_asked_say_it_once_and_not_at_all_when_they_hold_the_world() -> None:
    a = elsewhere_of("gpu07", "gpu[07-10]")
    b = elsewhere_of("gpu08", "gpu[07-10]")
    asked = ["gpu07:7420", "gpu08:7420"]
    note = elsewhere_note([a, b], [0, 1, 2, 3], 8, asked, "slurm:9.0", agents=True)
    assert note == (
        "ranks 0-3 of 8 are on the nodes asked (gpu07:7420, gpu08:7420) and SLURM_NNODES=4: the "
        "others run on other nodes (gpu09, gpu10), not asked. To take them in, run `hangdoc agent "
        "--listen 0.0.0.0:7420 --token-file FILE` on those nodes, then add them: `hangdoc "
        "diagnose slurm:9.0 --agents gpu07:7420,gpu08:7420,gpu09:7420,gpu10:7420 --token-file "
        "FILE` (or --hostfile FILE, one agent a line)"
    )
    assert elsewhere_note([a, b], list(range(8)), 8, asked, "slurm:9.0", agents=True) is None


def test_a_node_asked_that_held_no_rank_is_not_named_as_another_node() -> None:
    a = elsewhere_of("gpu07", "gpu[07-09]")
    note = elsewhere_note([a], [0, 1], 6, ["gpu07:7420", "[gpu08]:7420"], "slurm:9.0", agents=True)
    assert note is not None and "other nodes (gpu09), not asked" in note


def elsewhere_of(host: str, nodelist: str):
    env = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": nodelist}
    procs = [proc(31 + r, 1, (PY, "t.py"), {**env, "SLURM_PROCID": str(r)}) for r in (0, 1)]
    selection = select_ranks(table(*procs), [31, 32])
    there = elsewhere(selection.ranks, 8, host)
    assert there is not None
    return there


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu[07-09]", ["gpu07", "gpu08", "gpu09"]),
        ("a1,b[1,3-4]x", ["a1", "b1x", "b3x", "b4x"]),
        ("n[1-100]", None),  # too many to list
        ("n[1-2][3-4]", None),
        ("bad name", None),
    ],
)
def test_expand_nodelist(text: str, names: list[str] | None) -> None:
    assert _expand_nodelist(text) == names
