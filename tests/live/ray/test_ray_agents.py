"""hangdoc agents as Ray actors on a real local multi-node Ray cluster (tests/support/raycluster):
one per node, pinned there, reached over the same gRPC API as ``hangdoc agent``, behind the
caller's token, sampling a real Ray worker on its node, and gone when the block ends."""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors
from support.raycluster import RayCluster, ray_cluster  # noqa: F401

from hangdoc import __version__
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet.client import AgentAuth, AgentError, RemoteNode
from hangdoc.fleet.ray_agents import (
    RayAgentError,
    ray_agents,
    stop_ray_agents,
)

TOKEN = secrets.token_hex(16)
SLEEPER_FUNCTION = "hangdoc_ray_sleeper_waits_here"

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(ray_cluster: RayCluster) -> Iterator[RayCluster]:  # noqa: F811
    """This process connected to the cluster as a driver, as `hangdoc diagnose` is."""
    ray.init(address=ray_cluster.address, namespace="hangdoc-tests", log_to_driver=False, logging_level="WARNING")
    try:
        yield ray_cluster
    finally:
        stop_ray_agents()
        ray.shutdown()


@pytest.fixture(autouse=True)
def no_agent_left(cluster: RayCluster) -> Iterator[None]:
    """Whatever a test does, it leaves no agent actor behind."""
    yield
    stop_ray_agents()
    assert alive_agents(cluster) == []


def alive_agents(cluster: RayCluster) -> list[Any]:
    return list_actors(
        address=cluster.address,
        raise_on_missing_output=False,
        filters=[("class_name", "=", "HangdocAgent"), ("state", "=", "ALIVE")],
    )


def test_one_agent_per_node_on_its_node_answering_only_with_the_token(cluster: RayCluster) -> None:
    t0 = time.monotonic()
    with ray_agents(cluster.node_ids, token=TOKEN, start_timeout=90) as agents:
        print(f"{len(agents)} agents up in {time.monotonic() - t0:.1f} s")
        assert list(agents) == cluster.node_ids
        assert len(set(agents.values())) == len(cluster.node_ids)  # one server each
        placed = {a.name: a for a in alive_agents(cluster)}
        assert len(placed) == len(cluster.node_ids)
        for node_id, address in agents.items():
            actor = placed[agents.names[node_id]]
            assert actor.node_id == node_id  # Ray put it on the node it was made for
            assert actor.ray_namespace == "hangdoc"
            node = RemoteNode(address, AgentAuth(token=TOKEN))
            info = node.info()
            assert (info.hangdoc_version, info.pid) == (__version__, actor.pid)
            said = agents.info[node_id]
            assert (said["node_id"], said["pid"], said["address"]) == (node_id, actor.pid, address)
            assert said["raylet_pid"] and said["raylet_pid"] != said["pid"]
            node.close()
            host = address.rpartition(":")[0]
            assert host == ray.util.get_node_ip_address()  # the node's IP, not loopback
            for wrong in (AgentAuth(token=secrets.token_hex(16)), AgentAuth()):
                refused = RemoteNode(address, wrong)
                with pytest.raises(AgentError, match="refused the call"):
                    refused.info()
                refused.close()
    assert alive_agents(cluster) == []  # removed on the way out


def _sleeper_class() -> Any:
    """A Ray actor whose thread waits in ``SLEEPER_FUNCTION`` (defined here, so that Ray
    ships it by value: the test module is not importable on the workers)."""

    class Sleeper:
        def __init__(self) -> None:
            import threading

            threading.Thread(target=self.hangdoc_ray_sleeper_waits_here, daemon=True).start()

        def hangdoc_ray_sleeper_waits_here(self) -> None:
            while True:
                time.sleep(0.5)

        def where(self) -> tuple[int, str]:
            return os.getpid(), ray.get_runtime_context().get_node_id()

    return ray.remote(num_cpus=0)(Sleeper)


def test_an_agent_samples_a_ray_worker_on_its_node(cluster: RayCluster) -> None:
    node_id = cluster.worker_node_ids[-1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank_env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    sleeper = (
        _sleeper_class()
        .options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            runtime_env={"env_vars": rank_env},
        )
        .remote()
    )
    try:
        pid, placed_on = ray.get(sleeper.where.remote(), timeout=120)
        assert placed_on == node_id
        with ray_agents([node_id], token=TOKEN, start_timeout=90) as agents:
            node = RemoteNode(agents[node_id], AgentAuth(token=TOKEN))
            found = node.find_ranks(parse_job_spec(f"pid:{pid}"))
            assert [p.pid for p in found.ranks] == [pid], found
            deadline = time.monotonic() + 30
            while True:  # the thread may not have reached its function yet
                [sample] = node.sample(found.ranks, 0.0, native=False, timeout=10)
                assert sample.error is None, sample.error
                # py-spy names a method by its qualified name: Sleeper.hangdoc_...
                functions = {f.function.rpartition(".")[2] for th in sample.threads for f in th.frames}
                if SLEEPER_FUNCTION in functions or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            node.close()
            assert SLEEPER_FUNCTION in functions, sorted(functions)
    finally:
        ray.kill(sleeper)


def test_agents_are_removed_on_exit_and_kept_on_request(cluster: RayCluster) -> None:
    with pytest.raises(KeyboardInterrupt), ray_agents(cluster.node_ids, token=TOKEN) as agents:
        assert len(alive_agents(cluster)) == len(agents) == len(cluster.node_ids)
        raise KeyboardInterrupt  # Ctrl-C in the middle of a diagnosis
    assert alive_agents(cluster) == []

    with ray_agents(cluster.node_ids, token=TOKEN, keep=True) as agents:
        kept = dict(agents)
        names = sorted(agents.names.values())
    assert sorted(a.name for a in alive_agents(cluster)) == names
    for address in kept.values():  # still serving after the block
        node = RemoteNode(address, AgentAuth(token=TOKEN))
        assert node.info().hangdoc_version == __version__
        node.close()
    assert stop_ray_agents() == names
    assert alive_agents(cluster) == []


def test_a_node_without_an_agent_is_named_within_the_deadline(cluster: RayCluster) -> None:
    unknown = ray.NodeID.from_random().hex()  # a well-formed id no node has
    nodes = [cluster.head_node_id, unknown, "not-a-node-id"]
    t0 = time.monotonic()
    with pytest.raises(RayAgentError) as caught, ray_agents(nodes, token=TOKEN, start_timeout=20):
        pytest.fail("the block must not run while a node has no agent")
    took = time.monotonic() - t0
    assert took < 20 + 16, took  # the deadline, plus the time to remove the started agent
    assert sorted(caught.value.failed) == sorted([unknown, "not-a-node-id"])
    assert "not a Ray node id" in caught.value.failed["not-a-node-id"]
    assert unknown in str(caught.value)
    assert alive_agents(cluster) == []  # the head's agent did start, and is gone

    with ray_agents(nodes, token=TOKEN, start_timeout=20, partial=True) as agents:
        assert list(agents) == [cluster.head_node_id]
        assert sorted(agents.failed) == sorted([unknown, "not-a-node-id"])
        assert len(alive_agents(cluster)) == 1
    assert alive_agents(cluster) == []
