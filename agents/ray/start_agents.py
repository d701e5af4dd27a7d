"""Start one hangdoc agent on every alive node of a Ray cluster, as detached Ray actors.

Groundwork for the Ray integration (``hangdoc diagnose ray:JOB_ID``, not yet
implemented): until then, name the job by its rendezvous endpoint or a pid. Run from any
machine connected to the cluster (``RAY_ADDRESS`` or ``--address``), with hangdoc
installed in the cluster's Python environment on every node::

    (umask 077; openssl rand -hex 32 > ~/.hangdoc/token)
    python agents/ray/start_agents.py start --token-file ~/.hangdoc/token --hostfile nodes.txt
    hangdoc diagnose MASTER_ADDR:MASTER_PORT --hostfile nodes.txt --token-file ~/.hangdoc/token
    python agents/ray/start_agents.py stop

Each actor is pinned to its node with ``NodeAffinitySchedulingStrategy(soft=False)``, takes
no CPU, writes the token to a private 0600 file on its node and runs ``hangdoc agent`` as a
child that dies with it. The agent runs as the Ray workers' user, so it can sample them
only with ``kernel.yama.ptrace_scope=0`` or ``CAP_SYS_PTRACE`` (on KubeRay: add
``SYS_PTRACE`` to the Ray containers' ``securityContext.capabilities``).
The token travels to the nodes as an actor argument, through Ray's control plane; an
actor killed without ``stop`` takes its agent with it but leaves the token file in its
private 0700 directory under the node's temp dir.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NAMESPACE = "hangdoc"
NAME_PREFIX = "hangdoc-agent-"
DEFAULT_PORT = 7420
READY_TIMEOUT_S = 60.0
# Variables by which hangdoc recognises a rank: the agent must never look like one.
_RANK_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
              "PMIX_RANK")
# Run before exec in the agent's process: SIGTERM it when the actor that started it dies
# (the setting survives exec), so a killed actor leaves no agent behind.
_DIE_WITH_PARENT = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); "
                    "os.execv(sys.argv[1], sys.argv[1:])")


@ray.remote(num_cpus=0)
class HangdocAgent:
    """One ``hangdoc agent`` process on the node this actor is pinned to."""

    def __init__(self, token: str, port: int, extra_args: list[str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="hangdoc-agent-")  # mode 0700
        token_file = Path(self._dir) / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        self._address = f"{ray.util.get_node_ip_address()}:{port}"
        env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _DIE_WITH_PARENT, _hangdoc_executable(), "agent",
             "--listen", self._address, "--token-file", str(token_file), *extra_args],
            env=env, stdin=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout_s: float) -> str:
        """The agent's HOST:PORT once it accepts connections; raises if it exits or is late."""
        host, port = self._address.rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"hangdoc agent on {self._address} exited with "
                                   f"code {self._proc.returncode}")
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return self._address
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"hangdoc agent on {self._address} not listening after {timeout_s} s")

    def stop(self) -> None:
        """SIGTERM the agent (it exits cleanly on it), then remove the token."""
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def _hangdoc_executable() -> str:
    """hangdoc next to the worker's interpreter (the cluster's environment), else on PATH."""
    beside = Path(sys.executable).parent / "hangdoc"
    if beside.exists():
        return str(beside)
    found = shutil.which("hangdoc")
    if found is None:
        raise FileNotFoundError(f"hangdoc is not installed next to {sys.executable} "
                                "nor on PATH on this node")
    return found


def start(token_file: Path, hostfile: Path, port: int, extra_args: list[str]) -> int:
    """One pinned, detached actor per alive node; writes their addresses to the hostfile."""
    token = token_file.read_text().strip()
    actors = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        actors.append(HangdocAgent.options(
            name=NAME_PREFIX + node["NodeID"], namespace=NAMESPACE, lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(token, port, extra_args))
    addresses = ray.get([a.wait_ready.remote(READY_TIMEOUT_S) for a in actors])
    hostfile.write_text("".join(f"{a}\n" for a in sorted(addresses)))
    print(f"{len(addresses)} hangdoc {'agent' if len(addresses) == 1 else 'agents'} listening; addresses in {hostfile}")
    return 0


def stop() -> int:
    """Stop and remove every agent actor this script started."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == NAMESPACE and a["name"].startswith(NAME_PREFIX)]
    for name in names:
        actor = ray.get_actor(name, namespace=NAMESPACE)
        try:
            ray.get(actor.stop.remote(), timeout=30)
        finally:
            ray.kill(actor)
    print(f"stopped {len(names)} hangdoc {'agent' if len(names) == 1 else 'agents'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None, help="Ray cluster (default: RAY_ADDRESS)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start one agent per alive node")
    p_start.add_argument("--token-file", type=Path, required=True)
    p_start.add_argument("--hostfile", type=Path, default=Path("nodes.txt"))
    p_start.add_argument("--port", type=int, default=DEFAULT_PORT)
    p_start.add_argument("agent_args", nargs=argparse.REMAINDER,
                         help="after --: more arguments for `hangdoc agent` (e.g. TLS)")
    sub.add_parser("stop", help="stop the agents")
    args = parser.parse_args(argv)

    ray.init(address=args.address or os.environ.get("RAY_ADDRESS", "auto"),
             namespace=NAMESPACE, logging_level="WARNING")
    if args.command == "start":
        extra = [a for a in args.agent_args if a != "--"]
        return start(args.token_file.expanduser(), args.hostfile, args.port, extra)
    return stop()


if __name__ == "__main__":
    sys.exit(main())
