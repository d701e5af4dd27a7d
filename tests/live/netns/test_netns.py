"""NetnsNodes really builds reachable nodes, cut() silences them without RST, and nothing
it created survives: not on a normal exit, not after an exception, not after a crash."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
from support.netns import HOSTS_DIR, STATE_DIR, NetnsNodes, cleanup_stale
from support.paths import TESTS

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 `ip` is not installed"),
]

PORT = 7070

# Echo server for node 0; it exits by itself so a broken test cannot leave it behind.
SERVER = textwrap.dedent(f"""
    import socket, threading, time
    srv = socket.create_server(("0.0.0.0", {PORT}))
    srv.settimeout(60)
    def echo(conn):
        while data := conn.recv(64):
            conn.sendall(data)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
""")

# Client for node 1, driven line by line over stdin: "echo" uses the connection opened at
# start, "connect" opens a new one. Prints one word per command: ok, timeout or the error.
CLIENT = textwrap.dedent("""
    import socket, sys, time
    addr = (sys.argv[1], int(sys.argv[2]))
    for _ in range(50):
        try:
            conn = socket.create_connection(addr, timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    print("connected", flush=True)
    for line in sys.stdin:
        try:
            if line.strip() == "echo":
                conn.sendall(b"ping")
                conn.settimeout(2)
                print("ok" if conn.recv(64) == b"ping" else "bad", flush=True)
            else:
                socket.create_connection(addr, timeout=2).close()
                print("ok", flush=True)
        except socket.timeout:
            print("timeout", flush=True)
        except OSError as exc:
            print(type(exc).__name__ + str(exc.errno), flush=True)
""")


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"hdt{uuid.uuid4().hex[:5]}"
    yield name
    cleanup_stale(name)


def _leftovers(prefix: str) -> list[str]:
    """Every namespace, link, hosts dir and state record whose name starts with prefix."""
    ns_out = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    link_out = subprocess.run(["ip", "-o", "link"], check=False, capture_output=True, text=True).stdout
    names = [line.split()[0] for line in ns_out.splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in link_out.splitlines()]
    names += [p.name for p in HOSTS_DIR.glob("*")] if HOSTS_DIR.is_dir() else []
    names += [p.name for p in STATE_DIR.glob("*.json")]
    return sorted(name for name in names if name.startswith(prefix))


def _ask(client: subprocess.Popen, command: str) -> str:
    client.stdin.write(command + "\n")
    client.stdin.flush()
    return client.stdout.readline().strip()


def _alive(pid: int) -> bool:
    """True while pid runs (a killed orphan may stay a zombie until init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_nodes_talk_until_cut_then_traffic_vanishes(prefix: str) -> None:
    with NetnsNodes(2, prefix) as nodes:
        assert nodes.ip(0) != nodes.ip(1)
        assert nodes.ip(0).startswith("10.231.")
        server = nodes.popen(0, [sys.executable, "-c", SERVER])
        client = nodes.popen(
            1,
            [sys.executable, "-c", CLIENT, nodes.ip(0), str(PORT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout.readline().strip() == "connected"
        assert _ask(client, "echo") == "ok"
        assert _ask(client, "connect") == "ok"
        assert sorted(nodes.pids()) == sorted([server.pid, client.pid])

        nodes.cut()

        # An established connection neither answers nor breaks; a new one cannot be
        # made and is not refused either: the packets silently disappear.
        assert _ask(client, "echo") == "timeout"
        assert _ask(client, "connect") == "timeout"
        assert _ask(client, "echo") == "timeout"
    assert server.wait(timeout=5) == -signal.SIGKILL
    assert client.wait(timeout=5) == -signal.SIGKILL
    for pipe in (client.stdin, client.stdout):
        if pipe is not None:
            pipe.close()
    assert _leftovers(prefix) == []


def test_hostname_resolves_to_the_node_address(prefix: str) -> None:
    lookup = "import socket; print(socket.gethostbyname(socket.gethostname()))"
    with NetnsNodes(2, prefix) as nodes:
        for i in range(2):
            out = nodes.run(i, [sys.executable, "-c", lookup], capture_output=True, text=True)
            assert out.stdout.strip() == nodes.ip(i)


def test_everything_is_removed_after_an_exception(prefix: str) -> None:
    with pytest.raises(RuntimeError, match="boom"), NetnsNodes(3, prefix) as nodes:
        sleeper = nodes.popen(2, ["sleep", "600"])
        assert len(_leftovers(prefix)) == 3 + 3 + 1 + 3 + 1  # ns, veth, br, hosts, record
        raise RuntimeError("boom")
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert _leftovers(prefix) == []


def test_parallel_instances_get_different_subnets(prefix: str) -> None:
    with NetnsNodes(1, prefix + "a") as first, NetnsNodes(1, prefix + "b") as second:
        assert first.octet != second.octet
    with pytest.raises(RuntimeError, match="in use"), NetnsNodes(1, prefix), NetnsNodes(1, prefix):
        pass
    assert _leftovers(prefix) == []


def test_cleanup_stale_removes_a_crashed_run_but_not_a_live_one(prefix: str) -> None:
    crashed = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TESTS)!r})
        from support.netns import NetnsNodes
        nodes = NetnsNodes(2, {prefix + "x"!r}).__enter__()
        nodes.popen(1, ["sleep", "600"])
        print("up", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", crashed], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    orphans = _ns_pids(prefix + "xn1")
    assert orphans, "the crashed run's sleeper should still be inside its namespace"
    assert len(_leftovers(prefix + "x")) == 2 + 2 + 1 + 2 + 1

    with NetnsNodes(1, prefix + "y") as live:
        assert cleanup_stale(prefix) == [prefix + "x"]
        assert _leftovers(prefix + "x") == []
        assert all(not _alive(pid) for pid in orphans)
        assert len(_leftovers(live.prefix)) == 1 + 1 + 1 + 1 + 1
    assert _leftovers(prefix) == []


def _ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True).stdout
    return [int(tok) for tok in out.split()]


def test_cut_leaves_other_nodes_connected(prefix: str) -> None:
    with NetnsNodes(3, prefix) as nodes:
        nodes.popen(0, [sys.executable, "-c", SERVER])
        reach = textwrap.dedent(f"""
            import socket, sys, time
            deadline = time.monotonic() + 5
            while True:
                try:
                    socket.create_connection((sys.argv[1], {PORT}), timeout=1).close()
                    print("ok")
                    break
                except socket.timeout:
                    print("timeout")
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        print(type(exc).__name__)
                        break
                    time.sleep(0.1)
        """)

        def reach_from(i: int) -> str:
            argv = [sys.executable, "-c", reach, nodes.ip(0)]
            return nodes.run(i, argv, capture_output=True, text=True, timeout=20).stdout.strip()

        assert reach_from(1) == "ok"
        nodes.cut([2])
        assert reach_from(1) == "ok"
        started = time.monotonic()
        assert reach_from(2) == "timeout"
        assert time.monotonic() - started < 10


def test_host_ip_lets_the_root_namespace_reach_nodes(prefix: str) -> None:
    with NetnsNodes(2, prefix, host_ip=True) as nodes:
        server = nodes.popen(0, [sys.executable, "-c", SERVER])
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((nodes.ip(0), PORT), timeout=2) as conn:
                    conn.sendall(b"hi")
                    assert conn.recv(2) == b"hi"
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "server in node 0 never listened"
                time.sleep(0.1)
        assert nodes.host_address().startswith(f"10.231.{nodes.octet}.")
    assert server.wait(timeout=5) == -signal.SIGKILL
    assert _leftovers(prefix) == []
