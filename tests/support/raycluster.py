"""A real local multi-node Ray cluster for the live tests: started once per module, stopped
with every process it started, even when a test fails.

``ray.cluster_utils.Cluster`` runs a head node and worker nodes as separate raylets on this
machine, all on one IP address: nodes are told apart by their Ray node id, as hangdoc does.
The cluster keeps its files in a temp dir of its own (never ``/tmp/ray``: nor does it write
``/tmp/ray/ray_current_cluster``, so ``auto`` never finds it), picks free ports
(never the default 6379/8265/52365 another cluster may hold) and, when it is stopped, ends
each Ray process it started and their descendants (workers, job drivers) by pid: never
``ray stop``, which would end other people's clusters too.

Use::

    from support.raycluster import ray_cluster  # noqa: F401  (the fixture)

    def test_x(ray_cluster):
        ray_cluster.address        # "IP:PORT" of the GCS: what ray.init(address=...) takes
        ray_cluster.node_ids       # the nodes' Ray node ids (hex), head first
        ray_cluster.dashboard_url  # "http://127.0.0.1:PORT": the state and job APIs
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

WORKER_NODES = 2
CPUS_PER_NODE = 2
START_TIMEOUT_S = 120
# Ray's own start-up chatter and phoning home, off for every process the cluster starts.
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    # Ray turns token authentication on for a new cluster when RAY_AUTH_MODE is unset and
    # ~/.ray/auth_token exists, which any local `ray.init()` on the machine leaves behind;
    # a job driver that does not read the token then cannot connect. Said explicitly.
    "RAY_AUTH_MODE": "disabled",
}


@dataclass(frozen=True)
class RayCluster:
    """A running local cluster, as the tests see it."""

    address: str  # the GCS "IP:PORT": ray.init(address=...), ray.util.state, `ray job`
    node_ids: list[str]  # Ray node ids (hex), head first
    dashboard_url: str  # "http://IP:PORT": the state API and job submission
    temp_dir: str  # the cluster's own temp dir (logs under session_latest/logs)

    @property
    def head_node_id(self) -> str:
        return self.node_ids[0]

    @property
    def worker_node_ids(self) -> list[str]:
        return self.node_ids[1:]

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.temp_dir, "session_latest", "logs")


def _started_pids(cluster: Any) -> list[psutil.Process]:
    """Every process the cluster's nodes started, with all their descendants (workers,
    job supervisors, the drivers they run in sessions of their own)."""
    found: dict[int, psutil.Process] = {}
    for node in cluster.list_all_nodes():
        for infos in node.all_processes.values():
            for info in infos:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(info.process.pid)
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
    return list(found.values())


def _mentioning(text: str) -> list[psutil.Process]:
    """Processes whose command line names ``text`` (the cluster's unique temp dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(text in arg for arg in proc.info["cmdline"] or ()):
                found.append(proc)
    return found


def _kill(procs: list[psutil.Process]) -> None:
    """SIGKILL each process that is still the one found (psutil checks pid reuse)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.kill()
    psutil.wait_procs(procs, timeout=10)


def start_cluster(
    temp_dir: str, workers: int = WORKER_NODES, cpus: int = CPUS_PER_NODE, head_args: dict[str, Any] | None = None
) -> Any:
    """A ``ray.cluster_utils.Cluster``: a head with the dashboard and ``workers`` nodes;
    ``head_args`` adds to the head's ``ray.init``-like arguments (``ray_client_server_port``)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=False, connect=False)
    try:
        cluster.add_node(
            **{
                "num_cpus": cpus,
                "temp_dir": temp_dir,  # worker nodes take the head's
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": None,  # the first free port from 8265 on
                "dashboard_agent_listen_port": None,  # a free one, not 52365
                **(head_args or {}),
            }
        )
        for _ in range(workers):
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes(timeout=START_TIMEOUT_S)
    except BaseException:
        stop_cluster(cluster, temp_dir)
        raise
    return cluster


def _leave_current_cluster_alone(env: pytest.MonkeyPatch) -> None:
    """``Cluster`` records its address in ``/tmp/ray/ray_current_cluster`` (what ``auto``
    finds) and deletes that file at shutdown, whoever wrote it: not this one's business."""
    import ray._common.utils
    import ray._private.utils

    env.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)
    env.setattr(ray._common.utils, "reset_ray_address", lambda *args, **kwargs: None)


def stop_cluster(cluster: Any, temp_dir: str) -> None:
    """Shut the cluster down and kill, by pid, whatever of it is left."""
    import ray

    procs = _started_pids(cluster) + _mentioning(temp_dir)
    if ray.is_initialized():  # a test connected this process as a driver
        ray.shutdown()
    try:
        cluster.shutdown()
    finally:
        _kill(procs + _mentioning(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def describe(cluster: Any, temp_dir: str) -> RayCluster:
    head = cluster.head_node
    url = head.webui_url or ""
    if url and "://" not in url:
        url = f"http://{url}"
    return RayCluster(
        address=cluster.address,
        node_ids=[node.node_id for node in cluster.list_all_nodes()],
        dashboard_url=url,
        temp_dir=temp_dir,
    )


@contextlib.contextmanager
def running_cluster(
    workers: int = WORKER_NODES, cpus: int = CPUS_PER_NODE, head_args: dict[str, Any] | None = None
) -> Iterator[RayCluster]:
    """A cluster for the block; every process of it ended at its end."""
    # short: Ray's unix socket paths live under it (at most 107 characters)
    temp_dir = tempfile.mkdtemp(prefix="hdray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as env:
        for key, value in QUIET_ENV.items():
            env.setenv(key, value)
        env.delenv("RAY_ADDRESS", raising=False)
        _leave_current_cluster_alone(env)
        started = time.monotonic()
        cluster = start_cluster(temp_dir, workers, cpus, head_args)
        try:
            print(f"ray cluster up in {time.monotonic() - started:.1f} s")
            yield describe(cluster, temp_dir)
        finally:
            stop_cluster(cluster, temp_dir)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head and two worker nodes of 2 CPUs each, for the module's tests."""
    pytest.importorskip("ray")
    with running_cluster() as cluster:
        yield cluster
