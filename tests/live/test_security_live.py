"""Attacks on a real root agent and a root `hangdoc diagnose` by a real unprivileged user.

The attacker is uid 65534 (nobody), run through `setpriv`. Its "rank" names root-only
files in its own frames, swaps a seen script for a symlink, and calls a tokenless agent
over loopback for processes that are not its own. Nothing root-only may come back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.agents import REPO, Agent, running_agent, start_agent
from support.harness import free_port

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to act as another user"
    ),
]

NOBODY = 65534
MARKER = "HANGDOC-ROOT-ONLY-MARKER"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

VICTIM = """\
import os, sys, time
claimed, ready = sys.argv[1], sys.argv[2]
code = compile("import time\\n\\ndef hold():\\n    time.sleep(3600)\\n\\nhold()\\n", claimed, "exec")
open(ready, "w").close()
exec(code, {})
"""

TRAIN = """\
import sys, time


def hold():
    open(sys.argv[1], "w").close()
    time.sleep(3600)  # line 6: the frame the agent sees


hold()
"""


@pytest.fixture(scope="module")
def area() -> Iterator[Path]:
    """A directory nobody can use, with a root-only secret file in it."""
    root = Path(tempfile.mkdtemp(prefix="hdsec-"))
    root.chmod(0o755)
    secret = root / "secret"
    secret.write_text("".join(f"{MARKER}-{i}\n" for i in range(1, 12)))
    secret.chmod(0o600)
    work = root / "work"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Victims:
    """Processes started for a test; each killed with its whole session at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], ready: Path, port: int, user: bool = True) -> subprocess.Popen:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
        proc = subprocess.Popen(
            (AS_NOBODY if user else []) + argv,
            env=env,
            cwd="/",
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, f"victim exited {proc.returncode}"
            assert time.monotonic() < deadline, "victim never got ready"
            time.sleep(0.05)
        time.sleep(0.2)  # into the sleep
        return proc

    def kill(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@pytest.fixture
def victims() -> Iterator[Victims]:
    v = Victims()
    try:
        yield v
    finally:
        v.kill()


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> Iterator[Agent]:
    """A tokenless root agent on loopback, as shipped by default."""
    with running_agent(tmp_path_factory.mktemp("agent"), "--listen", "127.0.0.1:0", "--node-name", "n1") as a:
        yield a


def _victim(area: Path, victims: Victims, claimed: str, name: str, user: bool = True) -> tuple[int, int]:
    script = area / "work" / f"{name}.py"
    script.write_text(VICTIM)
    script.chmod(0o644)
    ready = area / "work" / f"{name}.ready"
    port = free_port()
    proc = victims.start([sys.executable, str(script), claimed, str(ready)], ready, port, user)
    return proc.pid, port


def _assert_no_secret(text: str, claimed: str) -> None:
    assert MARKER not in text
    if claimed == "/etc/shadow":
        for line in Path("/etc/shadow").read_text().splitlines():
            if len(line) > 8:
                assert line not in text


# ------------------------------------------------------------------ a root diagnose --save


@pytest.mark.parametrize("claimed", ["secret", "/etc/shadow"])
def test_root_diagnose_save_never_copies_a_file_named_by_a_frame(area, victims, claimed) -> None:
    claimed = str(area / "secret") if claimed == "secret" else claimed
    _, port = _victim(area, victims, claimed, "victim_save")
    saved = area / "snap.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hangdoc",
            "diagnose",
            f"127.0.0.1:{port}",
            "--json",
            "-q",
            "--window",
            "0.5",
            "--save",
            str(saved),
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    text = saved.read_text()
    assert claimed in text  # the frame naming the file was captured ...
    _assert_no_secret(text + out.stdout, claimed)  # ... and nothing of the file came with it
    saved.unlink()


# ------------------------------------------------------------------ through the agent, as nobody

CLIENT = """\
import json, sys
import grpc
from hangdoc.fleet.v1 import agent_pb2 as pb, agent_pb2_grpc as pb_grpc
address, own_job, root_job, root_pid, claimed = sys.argv[1:6]
stub = pb_grpc.AgentStub(grpc.insecure_channel(address))
out = {}
def code(call):
    try:
        return "OK", call()
    except grpc.RpcError as err:
        return err.code().name, None
c, own = code(lambda: stub.FindRanks(pb.FindRanksRequest(job=own_job), timeout=30))
out["own_find"] = c
own_pid = own.ranks[0].pid
c, _ = code(lambda: stub.FindRanks(pb.FindRanksRequest(job=root_job), timeout=30))
out["root_find"] = c
procs = pb.RankProcessList(processes=[pb.RankProcess(pid=own_pid, host="n1"),
                                      pb.RankProcess(pid=int(root_pid), host="n1")])
c, resp = code(lambda: stub.Sample(pb.SampleRequest(processes=procs, t=0.0, timeout_seconds=10), timeout=30))
out["sample"] = c
out["samples"] = {str(s.pid): {"error": s.sample.error.message if s.sample.HasField("error") else None,
                               "threads": len(s.sample.threads)} for s in resp.samples}
out["frames"] = [[f.filename, f.code] for f in resp.frames]
frames = [pb.Frame(function="hold", filename=claimed, line=n) for n in range(1, 12)]
c, src = code(lambda: stub.SampleSources(pb.SampleSourcesRequest(
    frames=frames, queries=[pb.SourceQuery(pid=own_pid, frames=frames),
                            pb.SourceQuery(pid=int(root_pid), frames=frames)]), timeout=30))
out["sources"] = c
out["source_text"] = [l.text for f in src.files for l in f.lines]
print(json.dumps(out))
"""


# Runs a script in a user namespace of its own, as `unshare -U` would (where it holds every
# capability, valid only inside), from an interpreter the user could already start.
IN_USERNS = """\
import ctypes, os, runpy, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _in_userns(area: Path) -> list[str]:
    wrapper = area / "work" / "in_userns.py"
    wrapper.write_text(IN_USERNS)
    return [sys.executable, str(wrapper)]


def _as_nobody_through_agent(area: Path, victims: Victims, agent: Agent, *, userns: bool) -> None:
    """nobody asks a root agent for its own rank and for root's; with ``userns`` both its
    rank and its client run in user namespaces of their own, where they hold every
    capability (CapEff all ones), valid only inside."""
    claimed = str(area / "secret")
    inside = _in_userns(area) if userns else [sys.executable]
    name = "victim_ns" if userns else "victim_own"
    script = area / "work" / f"{name}.py"
    script.write_text(VICTIM)
    ready = area / "work" / f"{name}.ready"
    own_port = free_port()
    own = victims.start(inside + [str(script), claimed, str(ready)], ready, own_port)
    if userns:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{own.pid}/status").read_text().splitlines())
        assert int(status["CapEff"], 16) & (1 << 19)  # CAP_SYS_PTRACE, in its own namespace
    root_pid, root_port = _victim(area, victims, claimed, f"{name}_root", user=False)
    from hangdoc.capture.find.jobspec import parse_job_spec
    from hangdoc.fleet.client import RemoteNode

    operator = RemoteNode(agent.address)  # root over loopback: the agent now knows that rank
    assert [p.pid for p in operator.find_ranks(parse_job_spec(f"127.0.0.1:{root_port}")).ranks] == [root_pid]
    operator.close()
    client = area / "work" / "client.py"
    client.write_text(CLIENT)
    out = subprocess.run(
        AS_NOBODY
        + inside
        + [str(client), agent.address, f"127.0.0.1:{own_port}", f"127.0.0.1:{root_port}", str(root_pid), claimed],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["own_find"] == "OK"
    assert result["root_find"] in ("PERMISSION_DENIED", "NOT_FOUND")
    assert result["sample"] == "OK"
    by_pid = result["samples"]
    assert "may not read" in by_pid[str(root_pid)]["error"]  # refused for that pid only ...
    assert by_pid[str(root_pid)]["threads"] == 0
    own = next(v for k, v in by_pid.items() if k != str(root_pid))
    assert own["error"] is None and own["threads"] >= 1  # ... its own rank was sampled
    claimed_codes = [code for name, code in result["frames"] if name == claimed]
    assert claimed_codes and not any(claimed_codes)  # the claimed file's frames, without code
    assert result["sources"] == "OK" and result["source_text"] == []
    _assert_no_secret(out.stdout, claimed)


def test_nobody_sees_only_its_own_processes_and_no_root_file(area, victims, agent) -> None:
    _as_nobody_through_agent(area, victims, agent, userns=False)


def test_a_user_namespace_buys_no_ptrace_rights(area, victims, agent) -> None:
    nothing = area / "work" / "nothing.py"
    nothing.write_text("")
    trial = subprocess.run(AS_NOBODY + _in_userns(area) + [str(nothing)], check=False, capture_output=True)
    if trial.returncode != 0:
        pytest.skip("this kernel lets no unprivileged user make a user namespace")
    _as_nobody_through_agent(area, victims, agent, userns=True)


def test_seen_script_swapped_for_a_symlink_serves_nothing(area, victims, agent) -> None:
    from hangdoc.capture.find.jobspec import parse_job_spec
    from hangdoc.fleet.client import RemoteNode
    from hangdoc.fleet.v1 import agent_pb2 as pb

    script = area / "work" / "train_swap.py"
    script.write_text(TRAIN)
    ready = area / "work" / "swap.ready"
    port = free_port()
    victims.start([sys.executable, str(script), str(ready)], ready, port)
    node = RemoteNode(agent.address)
    try:
        (proc,) = node.find_ranks(parse_job_spec(f"127.0.0.1:{port}")).ranks
        (sample,) = node.sample([proc], 0.0, native=False, timeout=10)
        frame = [f for th in sample.threads for f in th.frames if f.filename == str(script)][-1]
        assert frame.code == "time.sleep(3600)  # line 6: the frame the agent sees"
        before = node.sources({proc.pid: [frame]})
        assert any("def hold" in text for src in before for _, text in src.lines)
        script.unlink()
        script.symlink_to(area / "secret")  # the same name now points at a root-only file
        request = pb.SampleSourcesRequest(
            queries=[
                pb.SourceQuery(
                    pid=proc.pid, frames=[pb.Frame(function="hold", filename=str(script), line=n) for n in range(1, 12)]
                )
            ]
        )
        reply = node._stub.SampleSources(request, timeout=10)
        assert MARKER not in str(reply) and list(reply.files) == []
        (again,) = node.sample([proc], 1.0, native=False, timeout=10)
        assert MARKER not in repr(again)
    finally:
        node.close()


def test_rank_in_another_mount_namespace_gets_its_own_file(area, victims, agent) -> None:
    from hangdoc.capture.find.jobspec import parse_job_spec
    from hangdoc.fleet.client import RemoteNode

    app = area / "app"
    app.mkdir(exist_ok=True)
    host_copy = app / "train.py"
    host_copy.write_text(TRAIN.replace("line 6: the frame the agent sees", "HOST COPY"))
    inner = area / "inner.py"
    inner.write_text(TRAIN.replace("line 6: the frame the agent sees", "CONTAINER COPY"))
    ready = area / "ns.ready"
    port = free_port()
    shell = f"mount -t tmpfs none {app} && cp {inner} {host_copy} && exec {sys.executable} {host_copy} {ready}"
    victims.start(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell], ready, port, user=False)
    node = RemoteNode(agent.address)
    try:
        (proc,) = node.find_ranks(parse_job_spec(f"127.0.0.1:{port}")).ranks
        (sample,) = node.sample([proc], 0.0, native=False, timeout=10)
        codes = [f.code for th in sample.threads for f in th.frames if f.filename == str(host_copy)]
        assert codes == ["hold()", "time.sleep(3600)  # CONTAINER COPY"]
        sources = node.sources({proc.pid: [f for th in sample.threads for f in th.frames]})
        text = " ".join(t for s in sources for _, t in s.lines)
        assert "CONTAINER COPY" in text and "HOST COPY" not in text
    finally:
        node.close()


# ------------------------------------------------------------------ bounded work, audit


def _agent_children(agent: Agent) -> list[psutil.Process]:
    return psutil.Process(agent.proc.pid).children(recursive=True)


def test_sample_requests_are_bounded_and_leave_nothing_running(area, victims, agent) -> None:
    import grpc

    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

    _, port = _victim(area, victims, "/nonexistent/x.py", "victim_bounds", user=False)
    with grpc.insecure_channel(agent.address) as channel:
        stub = pb_grpc.AgentStub(channel)
        (proc,) = stub.FindRanks(pb.FindRanksRequest(job=f"127.0.0.1:{port}"), timeout=30).ranks
        many = pb.RankProcessList(processes=[proc] * 100)
        reply = stub.Sample(pb.SampleRequest(processes=many, t=0, timeout_seconds=10), timeout=30)
        assert len(reply.samples) == 1  # one dump for one pid, however often it is named
        for bad in (float("inf"), float("nan"), -5.0, 0.0, 1e9):
            with pytest.raises(grpc.RpcError) as err:
                stub.Sample(
                    pb.SampleRequest(processes=pb.RankProcessList(processes=[proc]), t=0, timeout_seconds=bad),
                    timeout=30,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        huge = pb.RankProcessList(processes=[pb.RankProcess(pid=p) for p in range(1, 3000)])
        with pytest.raises(grpc.RpcError) as err:
            stub.Sample(pb.SampleRequest(processes=huge, t=0), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stranger = pb.RankProcessList(processes=[proc, pb.RankProcess(pid=1)])
        reply = stub.Sample(pb.SampleRequest(processes=stranger, t=0, timeout_seconds=10), timeout=30)
        errors = {s.pid: s.sample.error.message for s in reply.samples}
        assert "not a rank process this agent found" in errors[1]
        assert errors[proc.pid] == ""  # one bad pid does not fail the call
    deadline = time.monotonic() + 10
    while _agent_children(agent) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _agent_children(agent) == []


def test_every_request_gets_one_audit_line(tmp_path) -> None:
    import grpc

    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef")
    token.chmod(0o600)
    a = start_agent(tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(token))
    try:
        with grpc.insecure_channel(a.address) as channel:
            stub = pb_grpc.AgentStub(channel)
            ok = (("authorization", "Bearer 0123456789abcdef0123456789abcdef"),)
            with pytest.raises(grpc.RpcError):
                stub.FindRanks(pb.FindRanksRequest(job="pid:1"), timeout=10)  # no token
            with pytest.raises(grpc.RpcError):
                stub.FindRanks(pb.FindRanksRequest(job="\x1b[2J" + "x" * 5000), timeout=10, metadata=ok)
            stub.Heartbeats(pb.HeartbeatsRequest(pids=[1, 2, 3]), timeout=10, metadata=ok)
    finally:
        a.stop()
    log = _agent_log(tmp_path)
    lines = [line for line in log.splitlines() if " audit " in line]
    assert len(lines) == 3, log
    denied, invalid, beats = lines
    assert "method=/hangdoc.v1.Agent/FindRanks" in denied and "denied" in denied
    assert "method=FindRanks" in invalid and "outcome=invalid" in invalid
    assert "\x1b" not in invalid and len(invalid) < 700  # no escape codes, bounded
    assert "method=Heartbeats" in beats and "pids=1,2,3" in beats and "outcome=ok" in beats
    assert "caller=operator(token)" in beats


def _agent_log(tmp: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp.glob("agent-*.log")))


# ------------------------------------------------------------------ bad start-up input


def _bad_start(tmp_path: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "hangdoc", "agent", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("hangdoc: error:")
    return out.stderr.splitlines()[0]


def test_agent_start_up_refuses_bad_input_in_one_line(tmp_path) -> None:
    assert "0 to 65535" in _bad_start(tmp_path, "--listen", "127.0.0.1:99999")
    assert "0 to 65535" in _bad_start(tmp_path, "--listen", "127.0.0.1:²")
    loose = tmp_path / "loose"
    loose.write_text("0123456789abcdef0123456789abcdef")
    loose.chmod(0o644)
    assert "chmod 600" in _bad_start(tmp_path, "--token-file", str(loose))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe" * 20)
    binary.chmod(0o600)
    assert "not UTF-8" in _bad_start(tmp_path, "--token-file", str(binary))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert "not a regular file" in _bad_start(tmp_path, "--token-file", str(fifo))
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    junk.chmod(0o600)
    line = _bad_start(tmp_path, "--tls-cert", str(junk), "--tls-key", str(junk), "--tls-ca", str(junk))
    assert "unusable TLS files" in line


# ------------------------------------------------------------------ another user's "rank"

STORE = """\
import os, socket, sys, time
store = socket.socket()
store.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
store.listen()
open(sys.argv[1], "w").close()
time.sleep(3600)
"""


def _orphan_as_nobody(victims: Victims, argv: list[str], ready: Path, port: int) -> psutil.Process:
    """nobody's process, below no process of root's (its shell exits: it is reparented), as
    an attacker's own would be; killed with its session by ``victims``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    orphan = (
        "import os, runpy, sys\n"
        "child = os.fork()\n"
        "if child:\n"
        "    open(sys.argv[2] + '.pid', 'w').write(str(child))\n"
        "    os._exit(0)\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    victims.procs.append(
        subprocess.Popen(
            AS_NOBODY + [argv[0], "-c", orphan, *argv[1:], str(ready)],
            env=env,
            cwd="/",
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the orphan never got ready"
        time.sleep(0.05)
    time.sleep(0.2)
    return psutil.Process(int(Path(f"{ready}.pid").read_text()))


def test_another_users_process_in_the_rendezvous_is_kept_apart(area, victims, agent) -> None:
    """nobody starts a "rank" with root's MASTER_ADDR/MASTER_PORT: root's diagnosis leaves it
    out and says so, and the agent never asks its probe; without a listener to say whose job
    it is, discovery refuses rather than merge two users' processes."""
    import grpc

    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

    store, squatter = area / "work" / "store.py", area / "work" / "squat.py"
    store.write_text(STORE)
    squatter.write_text(TRAIN)
    for listens in (True, False):
        port = free_port()
        tag = "listen" if listens else "quiet"
        own = victims.start(
            [sys.executable, str(store if listens else squatter), str(area / f"{tag}.root")],
            area / f"{tag}.root",
            port,
            user=False,
        )
        foreign = _orphan_as_nobody(victims, [sys.executable, str(squatter)], area / "work" / f"{tag}.nobody", port)
        with grpc.insecure_channel(agent.address) as channel:
            stub = pb_grpc.AgentStub(channel)
            if not listens:
                with pytest.raises(grpc.RpcError) as err:
                    stub.FindRanks(pb.FindRanksRequest(job=f"127.0.0.1:{port}"), timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert f"uid 0: pid {own.pid}" in err.value.details()
                assert f"uid {NOBODY}: pid {foreign.pid}" in err.value.details()
                continue
            found = stub.FindRanks(pb.FindRanksRequest(job=f"127.0.0.1:{port}"), timeout=30)
            assert [r.pid for r in found.ranks] == [own.pid]
            note = next(n for n in found.notes if "another user" in n)  # the words, for older coordinators
            assert f"pid {foreign.pid} (uid {NOBODY})" in note and "the user listening on MASTER_PORT" in note
            assert [list(n.pids) for n in found.noted if n.kind == "other_user"] == [[foreign.pid]]
            flight = stub.Flight(pb.FlightRequest(pids=[foreign.pid], timeout_seconds=2), timeout=30)
            assert list(flight.ranks) == []  # its probe is never asked for
