"""The agent under its two denial-of-service attacks (issue 23, items 3 and 4), measured.

Needs root and ``setpriv``: a real tokenless ``hangdoc agent`` on loopback, started under a
lowered descriptor limit (``prlimit --nofile``, as a stock systemd service's 1,024).

- ``starve``: uid 65534 runs ``--ranks`` "rank" processes whose probes drip one byte a
  second and holds ``--calls`` ``Flight`` calls on them at once; meanwhile root (the
  operator on a tokenless agent) times ``FindRanks`` every half second;
- ``idle``: ``--conns`` TCP connections that never send a byte; meanwhile root times
  ``GetInfo`` and ``FindRanks`` on a fresh channel.

Each prints the operator's latencies, the agent's threads, RSS and open descriptors
(psutil), how the attacker's calls ended, and how long SIGTERM took to end the agent.
Usage: ``python bench/bench_agent_limits.py starve|idle [--nofile 1024] ...``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import grpc
import psutil
from support.agents import start_agent
from support.attack import drip_ranks, flight_attack, idle_connections, open_count
from support.harness import free_port

from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc


class Watcher:
    """Peak threads, RSS and descriptors of a process, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.threads = self.rss = self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with self.proc.oneshot():
                    self.threads = max(self.threads, self.proc.num_threads())
                    self.rss = max(self.rss, self.proc.memory_info().rss)
                    self.fds = max(self.fds, self.proc.num_fds())
            except psutil.Error:
                return

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"peak_threads": self.threads, "peak_rss_mib": round(self.rss / 2**20, 1), "peak_fds": self.fds}


def limit(args) -> list[str]:
    return ["prlimit", f"--nofile={args.nofile}", "--"]


def timed(call) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        call()
        code = "OK"
    except grpc.RpcError as err:
        code = err.code().name
    return code, round(time.monotonic() - t0, 2)


def stop_time(proc) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - reported as "did not stop", then killed
        proc.kill()
        proc.wait()
        return float("inf")
    return round(time.monotonic() - t0, 2)


def starve(args, tmp: Path) -> dict:
    port = free_port()
    agent = start_agent(tmp, "--listen", "127.0.0.1:0", wrapper=limit(args))
    out: dict = {}
    try:
        base = psutil.Process(agent.proc.pid)
        out["idle_threads"], out["idle_rss_mib"] = base.num_threads(), round(base.memory_info().rss / 2**20, 1)
        with drip_ranks(tmp / "ranks", args.ranks, port) as ranks:
            watch = Watcher(agent.proc.pid)
            attacker = flight_attack(tmp / "ranks", agent.address, ranks.job, args.calls, args.timeout)
            try:
                time.sleep(args.settle)
                with grpc.insecure_channel(agent.address) as channel:
                    stub = pb_grpc.AgentStub(channel)
                    latencies = [
                        timed(lambda: stub.FindRanks(pb.FindRanksRequest(job=ranks.job), timeout=90))
                        for _ in range(args.samples)
                    ]
                out["operator_findranks"] = latencies
                out["operator_findranks_median_s"] = statistics.median(s for _, s in latencies)
                out["during"] = watch.stop()
                out["sigterm_s"] = stop_time(agent.proc)
            finally:
                attacker.kill()
                lines = [json.loads(line) for line in attacker.communicate(timeout=30)[0].splitlines() if line]
                out["attacker"] = [{k: v for k, v in x.items() if k != "detail"} for x in lines if "call" in x]
                out["attacker_details"] = sorted({x["detail"][:120] for x in lines if x.get("detail")})
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    return out


def idle(args, tmp: Path) -> dict:
    agent = start_agent(tmp, "--listen", "127.0.0.1:0", wrapper=limit(args))
    out: dict = {}
    try:
        watch = Watcher(agent.proc.pid)
        before = grpc.insecure_channel(agent.address)  # a channel the operator opened before the flood
        stub = pb_grpc.AgentStub(before)
        stub.GetInfo(pb.GetInfoRequest(), timeout=10)
        with before, idle_connections(agent.port, args.conns) as socks:
            out["connected"] = len(socks)
            time.sleep(1)
            out["open_channel_getinfo"] = timed(lambda: stub.GetInfo(pb.GetInfoRequest(), timeout=10))
            out["open_channel_findranks"] = timed(lambda: stub.FindRanks(pb.FindRanksRequest(job="pid:1"), timeout=10))
            # and a connection opened during it (its own subchannel: not the first channel's)
            with grpc.insecure_channel(agent.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                fresh = pb_grpc.AgentStub(channel)
                out["new_channel_getinfo"] = timed(
                    lambda: fresh.GetInfo(pb.GetInfoRequest(), timeout=30, wait_for_ready=True)
                )
            out["still_open_after_calls"] = open_count(socks)
            time.sleep(args.hold)
            out[f"still_open_{args.hold:g}s_later"] = open_count(socks)
            out["during"] = watch.stop()
            out["sigterm_s"] = stop_time(agent.proc)
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=["starve", "idle"])
    parser.add_argument("--nofile", type=int, default=1024, help="the agent's descriptor limit (prlimit)")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=60.0, help="the attacker's Flight timeout_seconds")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between the attack and the first call")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--conns", type=int, default=1100)
    parser.add_argument("--hold", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hdlim-") as tmp:
        Path(tmp).chmod(0o755)
        result = (starve if args.attack == "starve" else idle)(args, Path(tmp))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
