"""Nodes for the service's tests: network + PID namespaces, each with a `hangdoc agent
--server` and a spool from which jobs are started later; and `hangdoc server` in the root
namespace, reachable from the nodes on the bridge.

PID 1 of each node (``unshare --pid --fork --mount-proc``) is a small shell loop: it starts
the agent, then every ``*.start`` file dropped in the node's spool (one rank of a job) as it
appears, so a test can start a job on several nodes at any time. Every process carries
``HANGDOC_TEST_TAG``; ``kill`` kills the loops (their PID namespaces die with them) and
everything tagged.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil

from .harness import JOBS_DIR, free_port
from .multinode import _SCRUB, AGENT_PORT, TAG_VAR, TOKEN, _kill_tree, kill_tagged
from .netns import NetnsNodes
from .paths import REPO


class ServiceNodes:
    def __init__(self, nodes: NetnsNodes, workdir: Path, server_port: int) -> None:
        self.nodes = nodes
        self.workdir = workdir
        self.tag = uuid.uuid4().hex
        self.server_port = server_port
        self.token_file = workdir / "token"
        self.ready_dir = workdir / "ready"
        self.db = workdir / "incidents.db"
        self.loops: list[subprocess.Popen] = []
        self.server: subprocess.Popen | None = None
        self._env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        self._env.update({TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})

    @property
    def url(self) -> str:
        return f"http://{self.nodes.host_address()}:{self.server_port}"

    def spool(self, i: int) -> Path:
        return self.workdir / f"spool{i}"

    def agent_log(self, i: int) -> Path:
        return self.workdir / f"agent{i}.log"

    # -- the nodes ------------------------------------------------------------------

    def start_nodes(self) -> None:
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.ready_dir.mkdir(exist_ok=True)
        for i in range(self.nodes.n):
            self.spool(i).mkdir()
            agent = [
                sys.executable,
                "-m",
                "hangdoc",
                "agent",
                "--node-name",
                f"node{i}",
                "--listen",
                f"{self.nodes.ip(i)}:{AGENT_PORT}",
                "--token-file",
                str(self.token_file),
                "--server",
                f"{self.nodes.host_address()}:{self.server_port}",
            ]
            spool = shlex.quote(str(self.spool(i)))
            script = "\n".join(
                [
                    f"{shlex.join(agent)} 2>>{shlex.quote(str(self.agent_log(i)))} &",
                    "while true; do",
                    f"  for f in {spool}/*.start; do",
                    '    [ -e "$f" ] || continue',
                    '    mv "$f" "$f.run" && sh "$f.run" &',
                    "  done",
                    "  sleep 0.2",
                    "done",
                ]
            )
            argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script]
            with open(self.workdir / f"node{i}.log", "ab") as log:
                self.loops.append(
                    self.nodes.popen(
                        i,
                        argv,
                        env=self._env,
                        cwd=str(REPO),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def start_job(self, script: Path, placement: Sequence[Sequence[int]]) -> str:
        """Start a gloo job of ``script`` with ``placement[i]`` the global ranks of node i;
        returns its spec (MASTER_ADDR:MASTER_PORT: the address of rank 0's node, where it serves
        the rendezvous)."""
        port = free_port()
        world = sum(len(p) for p in placement)
        master = self.nodes.ip(next(i for i, ranks in enumerate(placement) if 0 in ranks))
        ready = self.ready_dir / str(port)
        ready.mkdir()
        for i, ranks in enumerate(placement):
            for local, rank in enumerate(ranks):
                env = {
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(len(ranks)),
                    "GROUP_RANK": str(i),
                    "GLOO_SOCKET_IFNAME": "eth0",
                    "HANGDOC_READY_DIR": str(ready),
                    "PYTHONPATH": str(JOBS_DIR),
                }
                argv = ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, str(script)]
                log = self.workdir / f"{script.stem}-{port}-rank{rank}.log"
                start = self.spool(i) / f"{port}-{rank}.start"
                start.write_text(f"exec {shlex.join(argv)} >>{shlex.quote(str(log))} 2>&1\n")
        return f"{master}:{port}"

    def wait_job_ready(self, spec: str, world: int, timeout: float = 120) -> None:
        ready = self.ready_dir / spec.rsplit(":", 1)[1]
        deadline = time.monotonic() + timeout
        while len(list(ready.glob("ready.*"))) < world:
            if time.monotonic() > deadline:
                raise AssertionError(f"{spec}: not ready after {timeout:.0f} s\n{self.output()}")
            time.sleep(0.2)

    def job_pids(self, spec: str) -> list[int]:
        port = spec.rsplit(":", 1)[1]
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                env = proc.environ()
            except psutil.Error:
                continue
            if env.get(TAG_VAR) == self.tag and env.get("MASTER_PORT") == port:
                found.append(proc.pid)
        return found

    # -- the server -----------------------------------------------------------------

    def start_server(self, *args: str) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "hangdoc",
            "server",
            "--listen",
            f"{self.nodes.host_address()}:{self.server_port}",
            "--db",
            str(self.db),
            "--token-file",
            str(self.token_file),
            *args,
        ]
        before = len(self.server_log())  # a restart appends to the same log
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - closed below, the child keeps its copy
        self.server = subprocess.Popen(
            argv, env=self._env, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 60
        while "listening on port" not in self.server_log()[before:]:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the server did not start\n{self.server_log()}")
            time.sleep(0.1)
        return self.server

    def stop_server(self, timeout: float = 60) -> int:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        code = self.server.wait(timeout)
        self.server = None
        return code

    def server_log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def get(self, path: str, token: str | None = TOKEN) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
                status = response.status
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            body, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
            err.close()
        return status, json.loads(body) if "json" in kind else body.decode(errors="replace")

    def wait_for(self, what: str, check, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f} s\n{self.output()}")
            time.sleep(1.0)

    def output(self, chars: int = 2500) -> str:
        parts = [f"--- server.log ---\n{self.server_log()[-chars:]}"]
        for path in sorted(self.workdir.glob("*.log")):
            if path.name != "server.log":
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # -- the end --------------------------------------------------------------------

    def kill(self, timeout: float = 30) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait(timeout)
        for loop in self.loops:
            _kill_tree(loop.pid)
        kill_tagged(self.tag, timeout)
        for loop in self.loops:
            loop.wait(timeout=timeout)


@contextmanager
def service_nodes(n: int, workdir: Path) -> Iterator[ServiceNodes]:
    """``n`` fresh nodes with agents reporting to a server port (the server is started by
    the test); everything killed and the nodes deleted on exit."""
    with ExitStack() as stack:
        nodes = stack.enter_context(NetnsNodes(n, f"hds{uuid.uuid4().hex[:4]}", host_ip=True))
        running = ServiceNodes(nodes, workdir, free_port())
        stack.callback(running.kill)
        running.start_nodes()
        yield running
