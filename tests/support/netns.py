"""Network namespaces as stand-in cluster nodes for tests (needs root and iproute2).

``NetnsNodes(n, prefix)`` builds n "nodes" on this machine: namespaces ``<prefix>n<i>``,
each with loopback up and an ``eth0`` whose peer ``<prefix>v<i>`` is enslaved to the bridge
``<prefix>br`` in the root namespace. Node i has address ``10.231.X.(i+1)/24``; the bridge
has no address unless ``host_ip=True``, so traffic stays between the namespaces created
here. ``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts`` over ``/etc/hosts``; ours maps
this machine's hostname to the node's own address (as on a real node, where gloo's default
device resolves the hostname) and ``<prefix>n<j>`` to every node.

``cut()`` disables the nodes' bridge ports: frames between nodes are silently dropped (no
RST, no ICMP, carrier stays up), so established TCP connections just stop moving, like
behind a dead switch.

Everything is deleted by name on exit, even after an exception, together with any process
still running inside the namespaces; what ``popen()`` started is also reaped then and its
pipes closed (read them inside the block). A record per live instance in ``STATE_DIR``
(owner pid and start time, chosen X) lets parallel runs pick different subnets and lets
``cleanup_stale()`` remove what crashed runs left behind without touching live ones.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

STATE_DIR = Path("/run/hangdoc-netns")
HOSTS_DIR = Path("/etc/netns")
NODE_IFNAME = "eth0"
SUBNET_PREFIX = "10.231"
HOST_OCTET = 254
_IFNAMSIZ = 15
_PORT_STATES = {"disabled": "0"}
# A name we create: instance prefix + "br" (bridge), "n<i>" (namespace) or "v<i>" (veth).
_NAME_RE = re.compile(r"^(?P<inst>.+?)(?P<kind>br|n|v)(?P<index>\d*)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _bridge_port_state(link: str, state: str) -> None:
    proc = subprocess.run(
        ["bridge", "link", "set", "dev", link, "state", _PORT_STATES[state]],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cannot set bridge port {link} {state}: {proc.stderr.strip()}")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: tells a live owner from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@contextmanager
def _state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _records() -> dict[str, dict]:
    records = {}
    for path in STATE_DIR.glob("*.json"):
        try:
            records[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            records[path.stem] = {}
    return records


def _owner_alive(record: Mapping) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and _start_time(pid) == record.get("start")


def _pick_octet(prefix: str, taken: set[int]) -> int:
    preferred = zlib.crc32(prefix.encode()) % 250 + 1
    for step in range(250):
        octet = (preferred - 1 + step) % 250 + 1
        if octet not in taken:
            return octet
    raise RuntimeError(f"all 10.231.X.0/24 subnets are in use by live NetnsNodes ({STATE_DIR})")


def _kill_inside(namespaces: Iterable[str], timeout: float = 5.0) -> None:
    """SIGKILL every process whose network namespace is one of ours, then wait for them."""
    pids: set[int] = set()
    for ns in namespaces:
        out = _ip("netns", "pids", ns, check=False).stdout
        pids.update(int(tok) for tok in out.split() if tok.isdigit())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists() and not _is_zombie(pid)}
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _reap(procs: Iterable[subprocess.Popen]) -> None:
    """Wait for each of ``procs`` (SIGKILL it first if it still runs: ``ip netns exec`` execs
    the command, so a process that left the namespace is still the Popen's) and close its
    pipes, so no Popen is collected running or holding a pipe."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _delete(namespaces: Iterable[str], links: Iterable[str]) -> None:
    """Delete by name, ignoring what is already gone; veths first (that frees their peers)."""
    namespaces = list(namespaces)
    _kill_inside(namespaces)
    for link in sorted(links, key=lambda name: name.endswith("br")):
        _ip("link", "del", link, check=False)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)
        hosts_dir = HOSTS_DIR / ns
        (hosts_dir / "hosts").unlink(missing_ok=True)
        if hosts_dir.is_dir():
            hosts_dir.rmdir()


class NetnsNodes:
    """n network namespaces on one bridge, usable as a context manager."""

    def __init__(self, n: int, prefix: str, *, host_ip: bool = False) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n must be in 1..200, got {n}")
        if not re.fullmatch(r"[a-z][a-z0-9]*", prefix):
            raise ValueError(f"prefix must be lowercase alphanumeric, got {prefix!r}")
        if len(f"{prefix}v{n - 1}") > _IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} too long: link names exceed {_IFNAMSIZ} chars")
        self.n = n
        self.prefix = prefix
        self.host_ip = host_ip
        self.bridge = f"{prefix}br"
        self.octet: int | None = None
        self._procs: list[subprocess.Popen] = []

    # -- names and addresses ------------------------------------------------------------

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{self._check(i)}"

    def veth(self, i: int) -> str:
        """The bridge-side end of node i's link (the node side is ``eth0``)."""
        return f"{self.prefix}v{self._check(i)}"

    def ip(self, i: int) -> str:
        if self.octet is None:
            raise RuntimeError("NetnsNodes used outside its `with` block")
        return f"{SUBNET_PREFIX}.{self.octet}.{self._check(i) + 1}"

    def host_address(self) -> str:
        """The root namespace's address on the bridge (only with ``host_ip=True``)."""
        if not self.host_ip or self.octet is None:
            raise RuntimeError("the root namespace has no address on this bridge")
        return f"{SUBNET_PREFIX}.{self.octet}.{HOST_OCTET}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def _check(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"node {i} out of range 0..{self.n - 1}")
        return i

    # -- running things -----------------------------------------------------------------

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside node i (kwargs go to ``subprocess.Popen``); killed, reaped and
        its pipes closed on exit if the caller has not done so."""
        proc = subprocess.Popen([*self.exec_prefix(i), *argv], env=env, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, i: int, argv: Sequence[str], check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside node i to completion (kwargs go to ``subprocess.run``)."""
        return subprocess.run([*self.exec_prefix(i), *argv], check=check, **kwargs)

    def pids(self) -> list[int]:
        """Processes currently running inside any of the nodes."""
        pids: set[int] = set()
        for i in range(self.n):
            out = _ip("netns", "pids", self.ns(i), check=False).stdout
            pids.update(int(tok) for tok in out.split() if tok.isdigit())
        return sorted(pids)

    def cut(self, nodes: Iterable[int] | None = None) -> None:
        """Silently drop all traffic to and from the given nodes (default: all of them)."""
        for i in range(self.n) if nodes is None else nodes:
            # Disabling the bridge port keeps the carrier up: with the link down instead, the
            # kernel reports EHOSTUNREACH to established sockets within a second or two.
            _bridge_port_state(self.veth(i), "disabled")

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._register()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill processes inside the nodes and delete every namespace and link we named."""
        if self.octet is None:
            return
        try:
            _delete([self.ns(i) for i in range(self.n)], [self.veth(i) for i in range(self.n)] + [self.bridge])
        finally:
            _reap(self._procs)
            self._procs.clear()
        (STATE_DIR / f"{self.prefix}.json").unlink(missing_ok=True)
        self.octet = None

    def _register(self) -> None:
        with _state_lock():
            records = _records()
            if self.prefix in records and _owner_alive(records[self.prefix]):
                raise RuntimeError(f"NetnsNodes prefix {self.prefix!r} is in use by a live run")
            taken = {r["octet"] for r in records.values() if _owner_alive(r) and "octet" in r}
            self.octet = _pick_octet(self.prefix, taken)
            record = {"pid": os.getpid(), "start": _start_time(os.getpid()), "octet": self.octet, "n": self.n}
            (STATE_DIR / f"{self.prefix}.json").write_text(json.dumps(record))

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        if self.host_ip:
            _ip("addr", "add", f"{self.host_address()}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            self._create_node(i)

    def _create_node(self, i: int) -> None:
        ns, veth = self.ns(i), self.veth(i)
        self._write_hosts(i)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth, "type", "veth", "peer", "name", NODE_IFNAME, "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", NODE_IFNAME)
        _ip("-n", ns, "link", "set", NODE_IFNAME, "up")

    def _write_hosts(self, i: int) -> None:
        lines = ["127.0.0.1 localhost", f"{self.ip(i)} {socket.gethostname()}"]
        lines += [f"{self.ip(j)} {self.ns(j)}" for j in range(self.n)]
        # Dual-stack servers (the TCPStore) see peers as v4-mapped addresses.
        lines += [f"::ffff:{self.ip(j)} {self.ns(j)}" for j in range(self.n)]
        hosts_dir = HOSTS_DIR / self.ns(i)
        hosts_dir.mkdir(parents=True, exist_ok=True)
        (hosts_dir / "hosts").write_text("\n".join(lines) + "\n")


def _our_names(prefix: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Namespaces and links in the system that look like ours, keyed by instance prefix."""
    namespaces: dict[str, set[str]] = {}
    links: dict[str, set[str]] = {}
    ns_out = _ip("netns", "list", check=False).stdout
    ns_names = {line.split()[0] for line in ns_out.splitlines() if line.strip()}
    if HOSTS_DIR.is_dir():
        ns_names |= {p.name for p in HOSTS_DIR.iterdir()}
    link_out = _ip("-o", "link", "show", check=False).stdout
    link_names = {line.split(":")[1].strip().split("@")[0] for line in link_out.splitlines()}
    for names, found, kinds in ((ns_names, namespaces, {"n"}), (link_names, links, {"v", "br"})):
        for name in names:
            match = _NAME_RE.match(name)
            if (
                match
                and match["inst"].startswith(prefix)
                and match["kind"] in kinds
                and (match["kind"] == "br") != bool(match["index"])
            ):
                found.setdefault(match["inst"], set()).add(name)
    return namespaces, links


def cleanup_stale(prefix: str = "hd") -> list[str]:
    """Delete namespaces/links/records left by dead NetnsNodes whose prefix starts with
    ``prefix``; live instances (owner process still running) are left alone.

    Returns the instance prefixes that were cleaned up.
    """
    with _state_lock():
        records = _records()
        namespaces, links = _our_names(prefix)
        instances = set(namespaces) | set(links) | {p for p in records if p.startswith(prefix)}
        stale = sorted(p for p in instances if not _owner_alive(records.get(p, {})))
        for inst in stale:
            _delete(namespaces.get(inst, ()), links.get(inst, ()))
            (STATE_DIR / f"{inst}.json").unlink(missing_ok=True)
    return stale
