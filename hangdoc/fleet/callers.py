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
  user that owns the caller's end of the connection (as this agent's user namespace sees
  it) and its socket inode, which leads to the process holding it. Whether that caller
  may read a process is asked of the kernel, not worked out here: a short-lived helper
  process with the caller's real uid, gid and groups (and, for a uid-0 caller, its
  permitted capabilities) opens the process's ``/proc/PID/environ`` (the ptrace access
  check, ``PTRACE_MODE_READ``); only what the kernel lets it open is read. Yama's
  ``ptrace_scope``, which applies to attaching and not to that check, is added on top
  (0: no limit; 1: only the caller's descendants; 2 and 3: none). A caller holding
  ``CAP_SYS_PTRACE`` reads everything only when it is in the agent's own user namespace:
  in a namespace of its own (``unshare -Ur``, open to any user) every capability is valid
  only inside it.
- **Unknown**: anything else (a socket the table does not show, a Unix socket): reads
  nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass, field

from ..capture.find.tcptable import ESTABLISHED, tcp_rows
from ..capture.read.sourcefs import in_our_user_namespace, read_status

log = logging.getLogger("hangdoc.agent")
_CAP_SYS_PTRACE = 1 << 19
_PEER = re.compile(r"^ipv(?P<v>[46]):\[?(?P<addr>[0-9A-Fa-f.:]+?)\]?:(?P<port>\d{1,5})$")
# The access check runs as the caller: a fresh interpreter (-I -S: no site, no user paths,
# no environment) takes the caller's real ids, groups and, for uid 0, its capabilities,
# then opens each /proc/PID/environ. It is started without switching ids in the agent's
# own fork (which gRPC's fork handlers make unsafe): subprocess then uses vfork.
# 15-40 ms, once per request of a tokenless local caller, on this project's 2-core machine.
_CHECK_TIMEOUT = 10.0
_CHECK = """
import os, sys
uid, gid, caps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4], 16)
if os.geteuid() == 0:
    os.setgroups([int(g) for g in sys.argv[3].split(",") if g])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # to any uid but 0 drops every capability
    if uid == 0:  # a uid-0 caller keeps only the capabilities it has
        import ctypes
        lo, hi = caps & 0xFFFFFFFF, caps >> 32
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)(lo, lo, 0, hi, hi, 0)
        if ctypes.CDLL(None, use_errno=True).capset(header, data) != 0:
            sys.exit("capset: " + os.strerror(ctypes.get_errno()))
if (os.getresuid(), os.getresgid()) != ((uid,) * 3, (gid,) * 3):
    sys.exit("cannot take the caller's ids")
ok = []
for pid in sys.argv[5:]:
    try:
        os.close(os.open("/proc/%s/environ" % pid, os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        continue
    ok.append(pid)
print(" ".join(ok))
"""


@dataclass(frozen=True)
class ProcCreds:
    """A process's ids and capabilities from /proc/PID/status, as this agent sees them."""

    uids: tuple[int, int, int, int]  # real, effective, saved, filesystem
    gids: tuple[int, int, int, int]
    ptrace_cap: bool  # CAP_SYS_PTRACE effective, and valid here (in our user namespace)
    ppid: int
    groups: tuple[int, ...] = ()
    caps: int = 0  # permitted capabilities, valid here; 0 in another user namespace

    @classmethod
    def of(cls, pid: int) -> ProcCreds | None:
        fields = read_status(pid)
        if fields is None:
            return None
        try:
            uids = tuple(int(x) for x in fields["Uid"].split())
            gids = tuple(int(x) for x in fields["Gid"].split())
            groups = tuple(int(x) for x in fields.get("Groups", "").split())
            ours = in_our_user_namespace(pid)
            effective = int(fields.get("CapEff", "0"), 16) if ours else 0
            permitted = int(fields.get("CapPrm", "0"), 16) if ours else 0
            return cls(
                uids[:4],  # type: ignore[arg-type]  # four ids in a well-formed status file
                gids[:4],  # type: ignore[arg-type]
                bool(effective & _CAP_SYS_PTRACE),
                int(fields.get("PPid", "0")),
                groups,
                permitted & effective,
            )
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


def _same_user(pid: int, uid: int) -> bool:
    """A necessary condition of the kernel's check, to keep the helper's list short: a
    caller without CAP_SYS_PTRACE reads only processes whose ids are all its own."""
    fields = read_status(pid)
    try:
        return fields is not None and {int(x) for x in fields["Uid"].split()[:3]} == {uid}
    except (KeyError, ValueError):
        return False


def kernel_check(creds: ProcCreds, pids: list[int]) -> set[int]:
    """The pids a process with ``creds`` may read, as the kernel answers a helper process
    that holds the same real ids, groups and (for uid 0) capabilities. Empty on failure."""
    if not pids:
        return set()
    uid, gid = creds.uids[0], creds.gids[0]
    if os.geteuid() != 0 and (uid, gid) != (os.getuid(), os.getgid()):
        return set()  # an unprivileged agent cannot act as anyone else (nor read them)
    argv = [
        os.path.realpath(sys.executable),
        "-I",
        "-S",
        "-c",
        _CHECK,
        str(uid),
        str(gid),
        ",".join(map(str, creds.groups)),
        f"{creds.caps:x}",
        *map(str, pids),
    ]
    try:
        done = subprocess.run(
            argv, env={}, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, timeout=_CHECK_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("cannot ask the kernel what uid %d may read: %s", uid, exc)
        return set()
    if done.returncode != 0:
        log.warning(
            "cannot ask the kernel what uid %d may read: the helper exited %d (%s)",
            uid,
            done.returncode,
            done.stderr.decode(errors="replace").strip()[-200:],
        )
        return set()
    allowed = {int(word) for word in done.stdout.split() if word.isdigit()}
    return allowed & set(pids)


@dataclass(frozen=True)
class Caller:
    """One caller of the agent, as identified for one request."""

    operator: bool
    uid: int | None = None
    pid: int | None = None  # the process holding the caller's socket, when found
    how: str = ""  # how it was identified, for the audit log
    yama_scope: int = field(default_factory=ptrace_scope)  # read once per caller
    _creds: ProcCreds | None = field(default=None, compare=False, repr=False)
    # what the kernel said, per pid, for this request
    _answers: dict[int, bool] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        if self.operator:
            return f"operator({self.how})"
        if self.uid is None:
            return f"unknown({self.how})"
        return f"uid={self.uid} pid={self.pid if self.pid is not None else '?'}"

    @property
    def reads_all(self) -> bool:
        return self.operator or bool(self._creds and self._creds.ptrace_cap)

    def may_read(self, pid: int) -> bool:
        """Whether this caller could read ``pid``'s memory with py-spy itself."""
        if self.reads_all:
            return True
        if self.uid is None or self.pid is None or self._creds is None:
            return False
        if pid not in self._answers:
            self._ask_kernel(pid)
        if not self._answers.get(pid, False):
            return False
        if self.yama_scope == 0:
            return True
        return self.yama_scope == 1 and _descends_from(pid, self.pid)

    def _ask_kernel(self, pid: int) -> None:
        """One helper run per request: the first question takes in every process of the
        caller's uid, so a whole process table costs one run."""
        assert self._creds is not None and self.uid is not None
        if self._answers:
            candidates = [pid] if _same_user(pid, self.uid) else []
        else:
            candidates = [int(n) for n in _proc_pids() if _same_user(int(n), self.uid)]
        allowed = kernel_check(self._creds, candidates)
        for each in candidates:
            self._answers[each] = each in allowed
        self._answers.setdefault(pid, False)


def _proc_pids() -> list[str]:
    try:
        return [n for n in os.listdir("/proc") if n.isascii() and n.isdigit()]
    except OSError:
        return []


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
    words = [int(addr_hex[i : i + 8], 16) for i in range(0, len(addr_hex), 8)]
    raw = struct.pack(f"={len(words)}I", *words)  # the kernel prints host-order words
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr, int(port_hex, 16)


def socket_owner(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> tuple[int, int] | None:
    """(uid, inode) of the established TCP socket bound to ``addr:port`` in this network
    namespace, or None when the table has none."""
    for row in tcp_rows():
        if row.state != ESTABLISHED:
            continue
        try:
            if _decode_address(row.local) == (addr, port):
                return row.uid, row.inode
        except ValueError:
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
    pid = socket_holder(uid, inode)
    creds = ProcCreds.of(pid) if pid is not None else None
    if creds is None:
        return Caller(operator=False, uid=uid, how="kernel socket table, holder not found")
    return Caller(operator=False, uid=creds.uids[0], pid=pid, how="kernel socket table", _creds=creds)
