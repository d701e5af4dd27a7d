"""A 3-node cluster on one machine for multi-node tests: namespaces as nodes, one agent each.

Each node is a network namespace (``netns.NetnsNodes`` with ``host_ip=True``, so this
process in the root namespace reaches the nodes) AND its own PID namespace: inside the node
``unshare --pid --fork --mount-proc --kill-child sh -c ...`` runs a tiny shell supervisor
(PID 1 there) that starts the node's ``hangdoc agent`` (plus an mTLS one when asked) and
the node's ranks of ONE gloo job, launched directly (MASTER_ADDR = node 0). An agent thus
sees only the processes of its own node, as on a real machine.

Every process carries ``HANGDOC_TEST_TAG``; ``Cluster.kill()`` kills each supervisor (the
kernel then kills its whole PID namespace), everything tagged, and waits until nothing
tagged is left. ``NetnsNodes`` deletes the namespaces, veths and bridge afterwards.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from .harness import JOBS_DIR, free_port
from .netns import NetnsNodes
from .paths import REPO

MULTINODE_JOBS = JOBS_DIR / "multinode"
AGENT_PORT = 7420
TLS_AGENT_PORT = 7421
TOKEN = "multinode-test-token-0123456789abcdef"
TAG_VAR = "HANGDOC_TEST_TAG"
# Variables of an enclosing launcher that must not leak into a node's processes.
_SCRUB = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GLOO_SOCKET_IFNAME",
    TAG_VAR,
)


@dataclass(frozen=True)
class ClusterJob:
    """One gloo job spread over the nodes: ``placement[i]`` are node i's global ranks."""

    script: Path
    placement: tuple[tuple[int, ...], ...]
    verdict: str
    culprits: tuple[int, ...]
    cut: bool = False  # isolate the nodes from each other once every rank is ready
    settle: float = 1.5

    @property
    def world(self) -> int:
        return sum(len(ranks) for ranks in self.placement)

    def node_of(self, rank: int) -> int:
        return next(i for i, ranks in enumerate(self.placement) if rank in ranks)


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_tls(directory: Path, ips: Sequence[str]) -> TlsFiles:
    """A throwaway CA, a server certificate for ``ips`` and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=hangdoc-test-ca",
        cwd=directory,
    )
    (directory / "server.ext").write_text(
        "subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips) + "\nextendedKeyUsage=serverAuth\n"
    )
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        _openssl(
            "req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN=hangdoc-{who}", cwd=directory
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{who}.pem",
            "-days",
            "1",
            "-extfile",
            f"{who}.ext",
            cwd=directory,
        )
    return TlsFiles(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
    )


def tagged_processes(tag: str) -> dict[int, list[str]]:
    """Live processes (pid -> cmdline) whose environment has ``HANGDOC_TEST_TAG=tag``."""
    needle = f"{TAG_VAR}={tag}".encode() + b"\0"
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle not in handle.read() + b"\0":
                    continue
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[pid] = proc.cmdline()
        except (OSError, psutil.Error):
            continue
    return found


class Cluster:
    """A running job on 3 nodes with an agent per node; see the module docstring."""

    def __init__(self, job: ClusterJob, nodes: NetnsNodes, workdir: Path, tls: TlsFiles | None) -> None:
        self.job = job
        self.nodes = nodes
        self.workdir = workdir
        self.tls = tls
        self.tag = uuid.uuid4().hex
        self.port = free_port()
        self.ready_dir = workdir / "ready"
        self.token_file = workdir / "token"
        self.supervisors: list[subprocess.Popen] = []

    # -- addresses --------------------------------------------------------------------

    @property
    def master_addr(self) -> str:
        return self.nodes.ip(0)

    def job_spec(self) -> str:
        return f"{self.master_addr}:{self.port}"

    def agent_address(self, i: int, port: int = AGENT_PORT) -> str:
        return f"{self.nodes.ip(i)}:{port}"

    def agents(self, port: int = AGENT_PORT) -> str:
        return ",".join(self.agent_address(i, port) for i in range(self.nodes.n))

    # -- starting -----------------------------------------------------------------------

    def start(self) -> None:
        self.ready_dir.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env.update({TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
        for i in range(self.nodes.n):
            argv = [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "sh",
                "-c",
                self._supervisor_script(i),
            ]
            with open(self.workdir / f"supervisor{i}.log", "ab") as log:
                self.supervisors.append(
                    self.nodes.popen(
                        i,
                        argv,
                        env=env,
                        cwd=str(REPO),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def _supervisor_script(self, i: int) -> str:
        """PID 1 of node i: its agent(s) and ranks in the background, then wait for all."""
        lines = ["set -e"]
        agent = [sys.executable, "-m", "hangdoc", "agent", "--node-name", f"node{i}"]
        lines.append(
            shlex.join([*agent, "--listen", self.agent_address(i), "--token-file", str(self.token_file)])
            + f" 2>>{shlex.quote(str(self.agent_log(i)))} &"
        )
        if self.tls is not None:
            lines.append(
                shlex.join(
                    [
                        *agent,
                        "--listen",
                        self.agent_address(i, TLS_AGENT_PORT),
                        "--tls-cert",
                        str(self.tls.server_cert),
                        "--tls-key",
                        str(self.tls.server_key),
                        "--tls-ca",
                        str(self.tls.ca),
                    ]
                )
                + f" 2>>{shlex.quote(str(self.agent_log(i, tls=True)))} &"
            )
        local = self.job.placement[i]
        for local_rank, rank in enumerate(local):
            rank_env = {
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.port),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.job.world),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(len(local)),
                "GROUP_RANK": str(i),
                "GLOO_SOCKET_IFNAME": "eth0",
                "HANGDOC_READY_DIR": str(self.ready_dir),
                "PYTHONPATH": str(JOBS_DIR),
            }
            argv = ["env", *(f"{k}={v}" for k, v in rank_env.items()), sys.executable, str(self.job.script)]
            log = self.workdir / f"rank{rank}.log"
            lines.append(f"{shlex.join(argv)} >>{shlex.quote(str(log))} 2>&1 &")
        lines.append("wait")
        return "\n".join(lines)

    def agent_log(self, i: int, tls: bool = False) -> Path:
        return self.workdir / f"agent{i}{'-tls' if tls else ''}.log"

    def wait_ready(self, timeout: float = 120) -> None:
        """Every agent listening and every rank ready; then cut (if asked) and settle."""
        deadline = time.monotonic() + timeout
        while missing := self._not_ready():
            for i, sup in enumerate(self.supervisors):
                if sup.poll() is not None:
                    raise AssertionError(
                        f"node{i}'s supervisor exited with {sup.returncode} "
                        f"while waiting for {missing}\n{self.output()}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready after {timeout:.0f}s: {missing}\n{self.output()}")
            time.sleep(0.2)
        if self.job.cut:
            self.isolate_nodes()
        time.sleep(self.job.settle)

    def _not_ready(self) -> list[str]:
        missing = [f"rank {r}" for r in range(self.job.world) if not (self.ready_dir / f"ready.{r}").exists()]
        for i in range(self.nodes.n):
            for tls in (False, True) if self.tls else (False,):
                log = self.agent_log(i, tls)
                if not log.exists() or "listening on port" not in log.read_text(errors="replace"):
                    missing.append(f"agent{'-tls' if tls else ''} on node{i}")
        return missing

    def isolate_nodes(self) -> None:
        """Drop traffic between nodes (no RST) while the root namespace still reaches each.

        ``NetnsNodes.cut()`` disables the bridge ports, which would also cut off the agents;
        isolated bridge ports only stop forwarding between each other.
        """
        for i in range(self.nodes.n):
            subprocess.run(
                ["bridge", "link", "set", "dev", self.nodes.veth(i), "isolated", "on"],
                check=True,
                capture_output=True,
                timeout=30,
            )

    def output(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # -- the processes ------------------------------------------------------------------

    def agent_pid(self, i: int, tls: bool = False) -> int:
        """Root-namespace pid of node i's agent."""
        port = TLS_AGENT_PORT if tls else AGENT_PORT
        for pid, cmdline in tagged_processes(self.tag).items():
            if "agent" in cmdline and f"node{i}" in cmdline and self.agent_address(i, port) in cmdline:
                return pid
        raise AssertionError(f"no agent process for node{i} (port {port})")

    def diagnose(self, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
        """``hangdoc diagnose`` from the root namespace; returns the result and seconds taken."""
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "hangdoc", "diagnose", self.job_spec(), "--json", "-q", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )
        return out, time.monotonic() - t0

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL every supervisor (its PID namespace dies with it) and all tagged processes."""
        for sup in self.supervisors:
            _kill_tree(sup.pid)
        kill_tagged(self.tag, timeout)
        for sup in self.supervisors:
            sup.wait(timeout=timeout)


def kill_tagged(tag: str, timeout: float) -> None:
    """SIGKILL every process carrying ``tag`` until none is left (RuntimeError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while left := tagged_processes(tag):
        for pid in left:
            _signal(pid, signal.SIGCONT)  # a stopped process still dies of SIGKILL; harmless
            _signal(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes survive SIGKILL: {left}")
        time.sleep(0.1)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_tree(pid: int) -> None:
    """Kill ``unshare``'s child (PID 1 of the node's PID namespace) first, then the rest."""
    try:
        root = psutil.Process(pid)
        tree = root.children(recursive=True)
    except psutil.Error:
        tree = []
    for proc in tree:
        _signal(proc.pid, signal.SIGKILL)
    _signal(pid, signal.SIGKILL)


@contextmanager
def cluster(job: ClusterJob, workdir: Path, *, tls: bool = False, prefix: str | None = None) -> Iterator[Cluster]:
    """Start ``job`` on 3 fresh nodes; kill everything and delete the nodes on exit."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = prefix or f"hdm{uuid.uuid4().hex[:4]}"
    with ExitStack() as stack:
        nodes = stack.enter_context(NetnsNodes(len(job.placement), prefix, host_ip=True))
        ips = [nodes.ip(i) for i in range(nodes.n)]
        tls_files = make_tls(workdir / "tls", ips) if tls else None
        running = Cluster(job, nodes, workdir, tls_files)
        stack.callback(running.kill)
        running.start()
        yield running


def assert_clean(tag: str, prefix: str) -> None:
    """Nothing tagged still runs and no namespace of ``prefix`` is left."""
    assert tagged_processes(tag) == {}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert not re.search(rf"^{prefix}n\d", names, re.MULTILINE), names
