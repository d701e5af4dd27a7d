"""The agent's pools and quotas (hangdoc.fleet.limits, node.ProbeReads), without a server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hangdoc.fleet import limits
from hangdoc.fleet.callers import OPERATOR_BY_TOKEN, Caller
from hangdoc.fleet.limits import Lanes, OverQuota
from hangdoc.fleet.node import ProbeReads, Quota
from hangdoc.model import ProbeAnswer, ProbeStatus


def test_quota_is_per_key_and_given_back() -> None:
    quota = Quota(2)
    assert quota.try_take(1) and quota.try_take(1)
    assert not quota.try_take(1)
    assert quota.try_take(2)  # another caller is not held up
    quota.give(1)
    assert quota.try_take(1)
    for key in (1, 1, 2):
        quota.give(key)
    assert quota.held(1) == quota.held(2) == 0


def test_probe_reads_hold_one_caller_to_its_share() -> None:
    reads = ProbeReads(workers=4, per_caller=2, name="t")
    at_once, most, lock = 0, 0, threading.Lock()

    def ask(pid: int) -> ProbeAnswer:
        nonlocal at_once, most
        with lock:
            at_once += 1
            most = max(most, at_once)
        time.sleep(0.05)
        with lock:
            at_once -= 1
        return ProbeAnswer(ProbeStatus.ANSWERED, str(pid))

    try:
        answers = reads.ask_all([1, 2, 3, 4, 5, 6], ask, who=65534)
    finally:
        reads.shutdown()
    assert [a.reason for a in answers.values()] == ["1", "2", "3", "4", "5", "6"]
    assert most == 2


def _user(uid: int) -> Caller:
    return Caller(operator=False, uid=uid, pid=1, how="test")


def test_a_user_past_its_requests_is_refused_at_once_and_the_operator_is_not() -> None:
    lanes = Lanes()
    release = threading.Event()

    async def main() -> None:
        user = lanes.lane(_user(65534))
        held = [asyncio.ensure_future(lanes.run(user, release.wait)) for _ in range(limits.REQUESTS_PER_USER)]
        await asyncio.sleep(0.05)
        with pytest.raises(OverQuota):
            await lanes.run(user, lambda: None)
        assert await lanes.run(lanes.lane(_user(1000)), lambda: "other user") == "other user"
        assert await lanes.run(lanes.lane(OPERATOR_BY_TOKEN), lambda: "operator") == "operator"
        for call in held:  # a caller that cancels its calls keeps its quota until the work ends
            call.cancel()
        await asyncio.sleep(0.05)
        with pytest.raises(OverQuota):
            await lanes.run(user, lambda: None)
        release.set()
        await asyncio.sleep(0.1)
        assert await lanes.run(user, lambda: "again") == "again"

    try:
        asyncio.run(main())
    finally:
        release.set()
        lanes.shutdown()


def test_connections_leave_half_the_descriptors_to_the_work() -> None:
    assert limits.max_connections(256) == 128
    assert limits.max_connections(65536) == limits.MAX_CONNECTIONS
    names = dict(limits.server_options(1024))
    assert names["grpc.max_allowed_incoming_connections"] == 512
    assert names["grpc.server_handshake_timeout_ms"] == limits.HANDSHAKE_TIMEOUT_MS


def test_one_call_keeps_a_bounded_number_of_flight_entries() -> None:
    from hangdoc.fleet.node import _EntryBudget
    from hangdoc.model import FlightEntry, FlightRecord, ProbeAnswer, ProbeStatus

    def answer(n: int) -> ProbeAnswer:
        return ProbeAnswer(
            ProbeStatus.ANSWERED, flight=FlightRecord(tuple(FlightEntry("0", i, "all_reduce") for i in range(n)))
        )

    budget = _EntryBudget(5_000)
    kept = [budget.keep(answer(2_000)) for _ in range(3)]
    assert [a.flight is not None for a in kept] == [True, True, False]  # 4,000 held; 2,000 more is past it
    assert "left out: this call's answers hold 4,000 of at most 5,000" in kept[2].reason
    assert budget.keep(answer(1_000)).flight is not None  # a smaller dump still fits
    assert budget.keep(ProbeAnswer(ProbeStatus.NO_PROBE, reason="no probe")).reason == "no probe"
