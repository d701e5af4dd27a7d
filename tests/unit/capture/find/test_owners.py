"""Whose job it is: each rule of ``owners.job_owner`` on both sides, and discovery keeping
another user's processes apart (``discover`` on hand-built tables)."""

from __future__ import annotations

import os
import socket

import pytest
from support.tables import PY, TORCHRUN, proc, table

from hangdoc.capture.find.discover import discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.find.jobsplit import MultipleJobs
from hangdoc.capture.find.owners import job_owner, listening_uids
from hangdoc.model import NoteKind

ROOT, NOBODY = 0, 65534


def _env(port: int, rank: int) -> dict[str, str]:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"}


def test_one_user_owns_a_job_of_one_user() -> None:
    t = table(proc(10, 1, (PY, "a.py"), _env(1, 0), uid=5), proc(11, 1, (PY, "a.py"), _env(1, 1), uid=5))
    owner = job_owner(t, [10, 11], [None, None])
    assert owner is not None and owner.uid == 5


def test_the_listener_on_master_port_decides() -> None:
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        assert listening_uids(port) == {os.geteuid()}
        t = table(
            proc(10, 1, (PY, "a.py"), _env(port, 0), uid=NOBODY),
            proc(11, 1, (PY, "a.py"), _env(port, 1), uid=NOBODY),
            proc(12, 1, (PY, "a.py"), _env(port, 1), uid=os.geteuid()),
        )
        owner = job_owner(t, [10, 11, 12], [None] * 3)
        assert owner is not None and owner.uid == os.geteuid()
        assert "listening on MASTER_PORT" in owner.how  # two of three ranks are no majority here
    assert listening_uids(port) == set()  # closed: the next rules apply


def test_the_named_pid_decides_without_a_listener() -> None:
    t = table(proc(10, 1, (PY, "a.py"), _env(1, 0), uid=ROOT), proc(11, 1, (PY, "a.py"), _env(1, 1), uid=NOBODY))
    owner = job_owner(t, [10, 11], [None, None], named_pid=10, port=1)
    assert owner is not None and owner.uid == ROOT and owner.how == "the user of pid 10"
    assert job_owner(t, [10, 11], [None, None], port=1) is None


def test_a_launcher_decides_only_when_every_rank_has_one() -> None:
    t = table(
        proc(9, 1, TORCHRUN, uid=ROOT),
        proc(10, 9, (PY, "a.py"), _env(1, 0), uid=ROOT),
        proc(11, 1, (PY, "a.py"), _env(1, 1), uid=NOBODY),
        proc(12, 9, (PY, "a.py"), _env(1, 1), uid=NOBODY),
    )
    owner = job_owner(t, [10, 12], [9, 9], port=1)  # nobody's process below root's launcher
    assert owner is not None and owner.uid == ROOT
    assert job_owner(t, [10, 11], [9, None], port=1) is None  # one rank below no launcher


def test_discovery_refuses_two_users_it_cannot_tell_apart() -> None:
    t = table(proc(10, 1, (PY, "a.py"), _env(1, 0), uid=ROOT), proc(11, 1, (PY, "a.py"), _env(1, 1), uid=NOBODY))
    with pytest.raises(MultipleJobs) as err:
        discover(parse_job_spec("127.0.0.1:1"), "n1", t)
    assert "uid 0: pid 10" in str(err.value) and "uid 65534: pid 11" in str(err.value)


def test_discovery_of_a_pid_leaves_the_other_users_process_out_and_says_so() -> None:
    t = table(
        proc(9, 1, TORCHRUN, uid=ROOT),
        proc(10, 9, (PY, "a.py"), _env(1, 0), uid=ROOT),
        proc(11, 9, (PY, "a.py"), _env(1, 1), uid=NOBODY),
    )
    found = discover(parse_job_spec("pid:9"), "n1", t)
    assert [r.pid for r in found.ranks] == [10]
    (note,) = [n for n in found.notes if "another user" in n.words()]
    assert "pid 11 (uid 65534)" in note.words() and "uid 0, the user of pid 9" in note.words()
    assert note.kind is NoteKind.OTHER_USER and note.pids == (11,)
