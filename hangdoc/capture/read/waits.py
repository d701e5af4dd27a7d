"""What each thread of a process is blocked on, read from the kernel, and who is at the
other end: the first link of a wait that may lead past the ranks.

A thread asleep in a system call shows it in ``/proc/PID/task/TID/syscall``: the call's
number and its arguments. The arguments name what it waits on:

- a descriptor (``read``, ``recvfrom``, ``accept``, ``connect``, ``write``, ...): its link
  in ``/proc/PID/fd`` is a pipe, a socket or a file. The other end of a pipe is every other
  process holding the pipe open for the other direction (``/proc/*/fd`` and the
  ``fdinfo`` flags); of a TCP socket, the process holding the socket whose address pair is
  the mirror of this one (``/proc/PID/net/tcp``, the process's own network namespace), or
  a host and port off this node; of a file lock (``flock``, ``fcntl`` ``F_SETLKW``), the
  process ``/proc/locks`` names as holding a lock on the file;
- an ``epoll_wait``'s descriptor lists the descriptors it watches (``fdinfo``'s ``tfd``);
- ``wait4``/``waitid``: a child process (a pid, or any child: the process's children);
- ``poll``/``ppoll``/``select``/``pselect6`` on a few descriptors: the descriptors are read
  from the waiting process's memory (``/proc/PID/mem``, readable by whoever may trace it:
  the same right py-spy needs), and a wait on one pipe or socket is a wait on it (a
  ``multiprocessing`` queue's ``get`` polls its pipe: the DataLoader's data queue);
- ``futex``: another thread of the same process (a lock, a condition: the stacks tell).

Nothing is read on a process's say-so: every pid comes from the kernel's tables, and a
process the caller may not read (``readable``) is never named as a peer. A wait read
during a call the thread is leaving is only as old as the read: a caller reads twice to be
sure (as the sampler does) before concluding anything.
"""

from __future__ import annotations

import os
import platform
import socket
import struct
from collections.abc import Callable, Iterable, Sequence

from ...model import ThreadWait, WaitKind, counted

# System call numbers by machine (the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h for arm64).
_X86_64 = {
    0: "read", 1: "write", 7: "poll", 17: "pread64", 19: "readv", 23: "select", 35: "nanosleep",
    42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
    61: "wait4", 72: "fcntl", 73: "flock", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
    219: "restart_syscall", 247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
    441: "epoll_pwait2",
}  # fmt: skip
_AARCH64 = {
    22: "epoll_pwait", 25: "fcntl", 32: "flock", 63: "read", 64: "write", 65: "readv", 67: "pread64",
    72: "pselect6", 73: "ppoll", 95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
    128: "restart_syscall", 202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg",
    212: "recvmsg", 242: "accept4", 260: "wait4", 441: "epoll_pwait2",
}  # fmt: skip
SYSCALLS = {"x86_64": _X86_64, "aarch64": _AARCH64}.get(platform.machine(), {})

_ON_FD = {"read", "write", "pread64", "readv", "connect", "accept", "accept4", "sendto", "recvfrom", "sendmsg"}
_ON_FD |= {"recvmsg", "flock"}
_EPOLL = {"epoll_wait", "epoll_pwait", "epoll_pwait2"}
_POLL = {"poll", "ppoll", "select", "pselect6"}
_SLEEP = {"nanosleep", "clock_nanosleep"}
_F_SETLKW, _F_OFD_SETLKW = 7, 38  # fcntl commands that wait for a lock
_P_PID = 1  # waitid's idtype for one pid
_WATCHED = 8  # descriptors of one epoll set resolved


# ``Wait`` is the model's ``ThreadWait``: a thread's wait, as a value.
Wait = ThreadWait


def process_waits(
    pids: Iterable[int], readable: Callable[[int], bool] = lambda _pid: True
) -> dict[int, tuple[Wait, ...]]:
    """``thread_waits`` of several processes, with one scan of ``/proc/*/fd`` for them all
    (made only when a pipe, socket or lock needs its other end named)."""
    table = _Holders()
    return {pid: thread_waits(pid, readable, table) for pid in pids}


def thread_waits(
    pid: int, readable: Callable[[int], bool] = lambda _pid: True, table: _Holders | None = None
) -> tuple[Wait, ...]:
    """The waits of ``pid``'s threads that are blocked in a system call; () when the process
    cannot be read. ``readable`` says which processes the caller may see as peers."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return ()
    table = table if table is not None else _Holders()
    waits = []
    for tid in tids:
        call = read_syscall(pid, tid)
        if call is not None:
            waits.append(_wait_of(pid, tid, *call, table, readable))
    return tuple(waits)


def read_syscall(pid: int, tid: int) -> tuple[str, tuple[int, ...]] | None:
    """(the call's name, its six arguments) of a thread blocked in a system call; None when
    it runs, is not in a call, or cannot be read."""
    text = _read(f"/proc/{pid}/task/{tid}/syscall")
    parts = text.split() if text else []
    if len(parts) < 7 or not parts[0].isdigit():  # "running", or "-1 sp pc" outside a call
        return None
    try:
        args = tuple(int(a, 16) for a in parts[1:7])
    except ValueError:
        return None
    return SYSCALLS.get(int(parts[0]), f"syscall {parts[0]}"), args


def _wait_of(
    pid: int, tid: int, call: str, args: tuple[int, ...], table: _Holders, readable: Callable[[int], bool]
) -> Wait:
    if call in _ON_FD or (call == "fcntl" and args[1] in (_F_SETLKW, _F_OFD_SETLKW)):
        return _on_fd(pid, tid, call, _signed(args[0]), table, readable)
    if call in ("wait4", "waitid"):
        one = _signed(args[0]) if call == "wait4" else (args[1] if args[0] == _P_PID else -1)
        kids = (one,) if one > 0 else _children(pid)
        return Wait(tid, call, WaitKind.CHILD, target=f"pid {one}" if one > 0 else "", peers=_shown(kids, readable))
    if call in _EPOLL:
        return _on_epoll(pid, tid, call, _signed(args[0]), table, readable)
    if call == "futex":
        return Wait(tid, call, WaitKind.THREAD)
    if call in _POLL:
        return _on_poll(pid, tid, call, args, table, readable)
    if call == "restart_syscall" and _polled(pid, "poll", args, strict=True):
        # a timed poll that a ptrace stop (py-spy's pause) interrupted goes on as
        # restart_syscall, its argument registers untouched: read as a poll where they hold
        # an array of pollfd of open descriptors, each waiting for some event
        return _on_poll(pid, tid, "poll", args, table, readable)
    if call in _SLEEP:
        return Wait(tid, call, WaitKind.SLEEP)
    return Wait(tid, call, WaitKind.OTHER)


def _on_fd(pid: int, tid: int, call: str, fd: int, table: _Holders, readable: Callable[[int], bool]) -> Wait:
    link = _link(pid, fd)
    if link is None:
        return Wait(tid, call, WaitKind.OTHER, fd)
    if call in ("flock", "fcntl"):
        return Wait(tid, call, WaitKind.FILE_LOCK, fd, link, _shown(_lock_holders(pid, fd, table), readable))
    if link.startswith("pipe:"):
        writing = _writes(pid, fd)
        ends = [p for p, f in table.holders(link) if p != pid and _writes(p, f) is not writing]
        return Wait(tid, call, WaitKind.PIPE, fd, link, _shown(ends, readable))
    if link.startswith("socket:"):
        if _listening(pid, link):
            return Wait(tid, call, WaitKind.LISTEN, fd, link)
        peers, remote, local = _socket_peer(pid, link, table)
        return Wait(tid, call, WaitKind.SOCKET, fd, link, _shown(peers, readable), remote, local if remote else "")
    return Wait(tid, call, WaitKind.FILE, fd, link)


def _on_epoll(pid: int, tid: int, call: str, epfd: int, table: _Holders, readable: Callable[[int], bool]) -> Wait:
    """An epoll wait is a wait on what its set watches (``_on_several``)."""
    return _on_several(pid, tid, call, _epoll_targets(pid, epfd), epfd, table, readable)


def _on_poll(
    pid: int, tid: int, call: str, args: tuple[int, ...], table: _Holders, readable: Callable[[int], bool]
) -> Wait:
    """A poll or select is a wait on what it polls (``_on_several``); unreadable: a poll."""
    return _on_several(pid, tid, call, _polled(pid, call, args), None, table, readable)


def _on_several(
    pid: int,
    tid: int,
    call: str,
    fds: Sequence[int],
    own: int | None,
    table: _Holders,
    readable: Callable[[int], bool],
) -> Wait:
    """A wait on several descriptors at once: on one pipe or socket, a wait on it; on
    several whose other ends are all the same processes (a child's stdout and stderr, read
    by ``subprocess.run(capture_output=True)``), a wait on those; else a poll."""
    watched = [fd for fd in fds if (_link(pid, fd) or "").startswith(("pipe:", "socket:"))]
    if len(watched) == 1:
        return _on_fd(pid, tid, call, watched[0], table, readable)
    several = counted(len(watched), "pipe or socket", "pipes and sockets") if watched else ""
    unresolved = Wait(tid, call, WaitKind.POLL, own, several)
    if not watched:
        return unresolved
    each = [_on_fd(pid, tid, call, fd, table, readable) for fd in watched]
    if each[0].peers and all(w.peers == each[0].peers and w.kind is each[0].kind for w in each):
        return each[0]
    # an event loop's poll of its connections (and maybe a listening socket): the processes
    # at their other ends, for a reader to weigh (a poll is idle unless nothing else is)
    return Wait(tid, call, WaitKind.POLL, own, unresolved.target, tuple(sorted({p for w in each for p in w.peers})))


def _polled(pid: int, call: str, args: tuple[int, ...], strict: bool = False) -> list[int]:
    """The descriptors a ``poll``/``ppoll`` (an array of ``struct pollfd``: int fd, short
    events, short revents) or a ``select``/``pselect6`` (a read set of ``nfds`` bits)
    waits on, read from the process's memory; [] for more than ``_WATCHED`` or unreadable."""
    if call in ("poll", "ppoll"):
        count = args[1]
        if args[0] < 4096:  # the first page is never mapped: not a pointer
            return []
        if not 0 < count <= _WATCHED:
            return []
        raw = _memory(pid, args[0], 8 * count)
        if raw is None:
            return []
        entries = list(struct.iter_unpack("=ihh", raw))
        if strict and not all(fd >= 0 and events and _link(pid, fd) is not None for fd, events, _ in entries):
            return []
        return [fd for (fd, _events, _revents) in entries if fd >= 0]
    nfds = args[0]
    if not 0 < nfds <= 1024 or not args[1]:
        return []
    raw = _memory(pid, args[1], (nfds + 7) // 8)
    if raw is None:
        return []
    fds = [fd for fd in range(nfds) if raw[fd // 8] >> (fd % 8) & 1]
    return fds if len(fds) <= _WATCHED else []


def _memory(pid: int, address: int, size: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            raw = mem.read(size)
    except (OSError, OverflowError, ValueError):
        return None
    return raw if len(raw) == size else None


def _epoll_targets(pid: int, epfd: int) -> list[int]:
    text = _read(f"/proc/{pid}/fdinfo/{epfd}") or ""
    fds = []
    for line in text.splitlines():
        if line.startswith("tfd:"):
            parts = line.split()
            if len(parts) > 1 and parts[1].isdigit():
                fds.append(int(parts[1]))
    return fds[:_WATCHED]


# ------------------------------------------------------------------ the other end


class _Holders:
    """Which processes hold which pipe or socket: ``/proc/*/fd``, read once when first asked."""

    def __init__(self) -> None:
        self._by_link: dict[str, list[tuple[int, int]]] | None = None
        self._unix: dict[int, int] | None = None  # Unix socket inode -> its peer's, this namespace

    def holders(self, link: str) -> list[tuple[int, int]]:
        if self._by_link is None:
            self._by_link = _scan()
        return self._by_link.get(link, [])

    def unix_peer(self, inode: int) -> int | None:
        if self._unix is None:
            self._unix = unix_peers()
        return self._unix.get(inode)


def _scan() -> dict[str, list[tuple[int, int]]]:
    found: dict[str, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if link.startswith(("pipe:", "socket:")) or link.startswith("/"):
                found.setdefault(link, []).append((int(name), int(fd)))
    return found


def _socket_peer(pid: int, link: str, table: _Holders) -> tuple[list[int], str, str]:
    """The processes holding the other end of a TCP or Unix socket on this node, else its
    remote ``HOST:PORT`` (a listening socket: neither); and its own ``HOST:PORT``."""
    inode = link[len("socket:[") : -1]
    rows = _tcp_rows(pid)
    mine = next((r for r in rows if r[2] == inode), None)
    if mine is None:
        peer = table.unix_peer(int(inode)) if inode.isdigit() and _own_netns(pid) else None
        if peer is None:
            return [], "", ""
        return [p for p, _ in table.holders(f"socket:[{peer}]") if p != pid], "", ""
    local, remote, _ = mine
    if remote.endswith(":0000") and set(remote.partition(":")[0]) <= {"0"}:
        return [], "", ""  # listening
    theirs = [r[2] for r in rows if r[0] == remote and r[1] == local]
    peers = [p for i in theirs for p, _ in table.holders(f"socket:[{i}]") if p != pid]
    return peers, "" if theirs else _address(remote), _address(local)


def socket_holders(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[int]]:
    """The processes of this node (its own network namespace) holding a TCP socket whose
    local address is the first of a pair and remote the second (``HOST:PORT`` as
    ``_address`` writes them): the other end of a wait another node read."""
    wanted = set(pairs)
    if not wanted:
        return {}
    table = _Holders()
    found: dict[tuple[str, str], list[int]] = {}
    for local, remote, inode in _tcp_rows(os.getpid()):
        key = (_address(local), _address(remote))
        if key in wanted:
            found.setdefault(key, []).extend(p for p, _ in table.holders(f"socket:[{inode}]"))
    return found


# sock_diag (linux/sock_diag.h, linux/unix_diag.h): the kernel's table of Unix sockets, each
# with the inode of its peer, as ``ss -x`` reads it
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_UDIAG_SHOW_PEER = 0x4
_UNIX_DIAG_PEER = 2
_UNIX_TABLE_BYTES = 64 << 20  # read at most this much of the table (about 1M sockets)


def unix_peers() -> dict[int, int]:
    """Every connected Unix socket of this network namespace: its inode -> its peer's; {}
    where the kernel offers no sock_diag."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return {}
    peers: dict[int, int] = {}
    with sock:
        sock.settimeout(2.0)
        request = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_PEER, 0, 0)
        header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        try:
            sock.send(header + request)
            read = 0
            while read < _UNIX_TABLE_BYTES:
                data = sock.recv(1 << 16)
                read += len(data)
                if not data or _unix_messages(data, peers):
                    break
        except OSError:
            return peers
    return peers


def _unix_messages(data: bytes, peers: dict[int, int]) -> bool:
    """Parse one netlink datagram into ``peers``; True at the dump's end."""
    at = 0
    while at + 16 <= len(data):
        length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, at)
        if length < 16 or at + length > len(data):
            return True
        if kind in (_NLMSG_DONE, _NLMSG_ERROR):
            return True
        body = at + 16
        if body + 16 <= at + length:
            inode = struct.unpack_from("=I", data, body + 4)[0]
            attr = body + 16
            while attr + 4 <= at + length:
                size, kind_attr = struct.unpack_from("=HH", data, attr)
                if size < 4:
                    break
                if kind_attr == _UNIX_DIAG_PEER and size >= 8:
                    peer = struct.unpack_from("=I", data, attr + 4)[0]
                    if peer:
                        peers[inode] = peer
                attr += (size + 3) & ~3
        at += (length + 3) & ~3
    return False


def _own_netns(pid: int) -> bool:
    """``pid`` shares this process's network namespace (where ``unix_peers`` reads)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def _listening(pid: int, link: str) -> bool:
    """A TCP socket in the LISTEN state (the tables' ``st`` column, 0A): waiting for work."""
    inode = link[len("socket:[") : -1]
    for table in ("tcp", "tcp6"):
        for line in (_read(f"/proc/{pid}/net/{table}") or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 10 and cols[9] == inode:
                return cols[3] == "0A"
    return False


def _tcp_rows(pid: int) -> list[tuple[str, str, str]]:
    """(local, remote, inode) of every TCP socket of ``pid``'s network namespace."""
    rows = []
    for table in ("tcp", "tcp6"):
        text = _read(f"/proc/{pid}/net/{table}") or ""
        for line in text.splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 10:
                rows.append((cols[1], cols[2], cols[9]))
    return rows


def _address(hex_pair: str) -> str:
    """``0100007F:1F90`` → ``127.0.0.1:8080``; IPv6 in full hex words as the kernel writes them."""
    addr, _, port = hex_pair.partition(":")
    try:
        number = int(port, 16)
        if len(addr) == 8:
            return f"{'.'.join(str(b) for b in bytes.fromhex(addr)[::-1])}:{number}"
        words = [bytes.fromhex(addr[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
        return f"[{':'.join(w[j : j + 4] for w in words for j in (0, 4))}]:{number}"
    except ValueError:
        return hex_pair


def _lock_holders(pid: int, fd: int, table: _Holders) -> list[int]:
    """Processes ``/proc/locks`` names as holding a lock on the file of ``pid``'s ``fd``; where
    it names none (an open file description's lock shows pid -1), those holding the file open."""
    try:
        st = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = []
    for line in (_read("/proc/locks") or "").splitlines():
        cols = line.split()
        if "->" in cols or len(cols) < 6 or cols[5] != key:  # "->": a waiter, not a holder
            continue
        if cols[4].isdigit() and int(cols[4]) != pid:
            holders.append(int(cols[4]))
    if not holders:
        holders = [p for p, _ in table.holders(_link(pid, fd) or "") if p != pid]
    return holders


def _children(pid: int) -> tuple[int, ...]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            kids += [int(k) for k in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    except OSError:
        return ()
    return tuple(sorted(set(kids)))


def _writes(pid: int, fd: int) -> bool | None:
    """Whether ``fd`` is open for writing (``fdinfo``'s flags); None when unreadable."""
    for line in (_read(f"/proc/{pid}/fdinfo/{fd}") or "").splitlines():
        if line.startswith("flags:"):
            try:
                return int(line.split()[1], 8) & 3 != os.O_RDONLY
            except (IndexError, ValueError):
                return None
    return None


def _shown(pids: Iterable[int], readable: Callable[[int], bool]) -> tuple[int, ...]:
    return tuple(sorted({p for p in pids if readable(p)}))


def _link(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _signed(value: int) -> int:
    """A register's value as the C ``int`` it holds (``-1`` for any child)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(1 << 20)
    except OSError:
        return None
