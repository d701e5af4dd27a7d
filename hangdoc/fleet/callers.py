"""Who is calling the agent, and which processes that caller may read through it.

An agent usually runs as root and can ptrace every process on its node. It must not be a
way around the kernel: a caller sees through it only what it could see with py-spy
itself, unless it proves it is the operator.

- **Operator**: a caller that presented the agent's token or a client certificate signed
  by its CA (every caller, when the agent requires either), and an unauthenticated caller
  from off the node when the agent was started with ``--insecure`` (that flag says the
  network is trusted). The operator reads every process on the node.
- **A local user**: a tokenless caller over loopback. The kernel's socket table of the
  agent's network namespace (``/proc/net/tcp``, ``tcp6``; what identd reads) names the
  user that owns the caller's end of the connection and its socket inode, which leads to
  the process holding it. That caller may read a process exactly when the kernel would let
  it ptrace-read it (``PTRACE_MODE_ATTACH_REALCREDS``, what py-spy's
  ``process_vm_readv`` needs): root or ``CAP_SYS_PTRACE`` reads everything; otherwise the
  target's real, effective and saved uids and gids must all be the caller's, the target
  must be dumpable, and Yama's ``ptrace_scope`` must allow it (0: yes; 1: only the
  caller's descendants; 2 and 3: never).
- **Unknown**: anything else (a socket the table does not show, a Unix socket): reads
  nothing.
"""

from __future__ import annotations

import ipaddress
import os
import re
import struct
from dataclasses import dataclass, field

from ..capture.sourcefs import read_status

_CAP_SYS_PTRACE = 1 << 19
_ESTABLISHED = "01"
_PEER = re.compile(r"^ipv(?P<v>[46]):\[?(?P<addr>[0-9A-Fa-f.:]+?)\]?:(?P<port>\d{1,5})$")
_PROC_NET = ("/proc/net/tcp", "/proc/net/tcp6")


@dataclass(frozen=True)
class ProcCreds:
    """A process's ids and capabilities from /proc/PID/status."""

    uids: tuple[int, int, int, int]  # real, effective, saved, filesystem
    gids: tuple[int, int, int, int]
    ptrace_cap: bool
    ppid: int

    @classmethod
    def of(cls, pid: int) -> ProcCreds | None:
        fields = read_status(pid)
        if fields is None:
            return None
        try:
            uids = tuple(int(x) for x in fields["Uid"].split())
            gids = tuple(int(x) for x in fields["Gid"].split())
            caps = int(fields.get("CapEff", "0"), 16)
            return cls(uids[:4], gids[:4], bool(caps & _CAP_SYS_PTRACE),  # type: ignore[arg-type]
                       int(fields.get("PPid", "0")))
        except (KeyError, ValueError):
            return None


def ptrace_scope() -> int:
    """Yama's kernel.yama.ptrace_scope (0 when Yama is not built in)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == ancestor:
            return True
        creds = ProcCreds.of(pid)
        if creds is None:
            return False
        pid, seen = creds.ppid, seen + 1
    return pid == ancestor


@dataclass(frozen=True)
class Caller:
    """One caller of the agent, as identified for one request."""

    operator: bool
    uid: int | None = None
    pid: int | None = None  # the process holding the caller's socket, when found
    how: str = ""  # how it was identified, for the audit log
    yama_scope: int = field(default_factory=ptrace_scope)  # read once per caller
    _creds: ProcCreds | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        if self.operator:
            return f"operator({self.how})"
        if self.uid is None:
            return f"unknown({self.how})"
        return f"uid={self.uid} pid={self.pid if self.pid is not None else '?'}"

    @property
    def reads_all(self) -> bool:
        return self.operator or self.uid == 0 or bool(self._creds and self._creds.ptrace_cap)

    def may_read(self, pid: int) -> bool:
        """Whether this caller could read ``pid``'s memory with py-spy itself."""
        if self.reads_all:
            return True
        if self.uid is None or self.pid is None or self._creds is None:
            return False
        target = ProcCreds.of(pid)
        if target is None:
            return False
        uid, gid = self._creds.uids[0], self._creds.gids[0]
        if set(target.uids[:3]) != {uid} or set(target.gids[:3]) != {gid}:
            return False
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                return False  # not dumpable: the kernel hands /proc/PID to root
        except OSError:
            return False
        if self.yama_scope == 0:
            return True
        return self.yama_scope == 1 and _descends_from(pid, self.pid)


OPERATOR_BY_TOKEN = Caller(operator=True, how="token")
OPERATOR_BY_CERT = Caller(operator=True, how="client certificate")


def parse_peer(peer: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """(address, port) of a gRPC peer string such as ``ipv4:127.0.0.1:5000``."""
    m = _PEER.match(peer or "")
    if not m:
        return None
    try:
        addr = ipaddress.ip_address(m["addr"])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr, int(m["port"])


def _decode_address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    addr_hex, port_hex = text.split(":")
    words = [int(addr_hex[i:i + 8], 16) for i in range(0, len(addr_hex), 8)]
    raw = struct.pack(f"={len(words)}I", *words)  # the kernel prints host-order words
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr, int(port_hex, 16)


def socket_owner(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> tuple[int, int] | None:
    """(uid, inode) of the established TCP socket bound to ``addr:port`` in this network
    namespace, or None when the table has none."""
    for path in _PROC_NET:
        try:
            with open(path) as table:
                next(table, None)
                for line in table:
                    cols = line.split()
                    if len(cols) < 10 or cols[3] != _ESTABLISHED:
                        continue
                    try:
                        if _decode_address(cols[1]) == (addr, port):
                            return int(cols[7]), int(cols[9])
                    except ValueError:
                        continue
        except OSError:
            continue
    return None


def _holds(pid: str, target: str) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


_holders: dict[int, int] = {}  # socket inode -> pid, checked again before each use
_MAX_HOLDERS = 1024


def socket_holder(uid: int, inode: int) -> int | None:
    """A process of ``uid`` that holds socket ``inode`` open, or None."""
    target = f"socket:[{inode}]"
    cached = _holders.get(inode)
    if cached is not None and _holds(str(cached), target):
        return cached
    for name in os.listdir("/proc"):
        if not name.isascii() or not name.isdigit():
            continue
        try:
            if uid != 0 and os.stat(f"/proc/{name}").st_uid != uid:
                continue
        except OSError:
            continue
        if _holds(name, target):
            if len(_holders) >= _MAX_HOLDERS:
                _holders.clear()
            _holders[inode] = int(name)
            return int(name)
    return None


def identify(peer: str, *, trust_remote: bool) -> Caller:
    """The caller behind gRPC ``peer`` on an agent without token or certificate."""
    parsed = parse_peer(peer)
    if parsed is None:
        return Caller(operator=False, how="peer not identifiable")
    addr, port = parsed
    if not addr.is_loopback:
        if trust_remote:
            return Caller(operator=True, how="--insecure remote peer")
        return Caller(operator=False, how="remote peer without credentials")
    owner = socket_owner(addr, port)
    if owner is None:
        return Caller(operator=False, how="socket not in the kernel's table")
    uid, inode = owner
    if uid == 0:
        return Caller(operator=False, uid=0, how="kernel socket table")  # reads all: no pid needed
    pid = socket_holder(uid, inode)
    creds = ProcCreds.of(pid) if pid is not None else None
    if creds is not None:
        uid = creds.uids[0]
    return Caller(operator=False, uid=uid, pid=pid, how="kernel socket table", _creds=creds)
