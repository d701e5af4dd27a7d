"""Coordinator fan-out to N real ``hangdoc agent`` gRPC servers on loopback.

For each N it starts N agent processes (``python -m hangdoc agent --listen 127.0.0.1:0
--replay SNAPSHOT``, one process each, started in batches), agent K serving the 3-rank
snapshot as ranks 3K..3K+2 of a 3N-rank job. With ``--per-process K`` it starts N/K host
processes instead, each running K agents: K ``hangdoc.fleet.agent.serve`` servers (the code
behind ``hangdoc agent``, each its own gRPC server on its own port) on one event loop, with a
token (as an agent off loopback must have one); that is how thousands of agents fit on a
small machine. The agents replay, so a capture costs ~0 and
what is measured is the coordinator itself: fan-out, gRPC, protobuf decode. In one run:

- ``find_ranks``: over N ``RemoteNode``s (GetInfo version check + FindRanks), fresh channels;
- ``watch``: one full ``observe()`` (window 2 s, interval 0.5 s); the time beyond the window,
  and the verdict, which must be collective_mismatch with culprits 3K+2 on every node;
- ``sample_all``: one lock-step round over all nodes, median of ``--repeat`` rounds, with
  the protobuf bytes of one round (requests + responses, re-encoded here);
- the coordinator's peak RSS (``ru_maxrss``, monotonic over the run, sizes run ascending).

With ``--tree`` (hosted agents only) it compares instead, over the same agents, the flat
fan-out and the relay tree (``hangdoc.fleet.tree``): find_ranks, one whole ``observe()``,
rounds, and the coordinator's and the agents' CPU of each, printed as one table.

Every agent is killed at the end of its size, also on error, and the run checks none is left.

Usage: ``python bench/bench_fanout.py [--sizes 8,32,128] [--per-process K] [--tree] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import platform
import pstats
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import psutil
from run_demo import tagged

from hangdoc.analysis.analyse import analyse
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import coordinator, tree, wire
from hangdoc.fleet.agent import MAX_DUMP_TIMEOUT
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.coordinator import Fleet, fan_out, find_ranks, sample_all
from hangdoc.fleet.node import Node
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.model import Sample, Unreachable, counted
from hangdoc.pipeline import CaptureOptions, observe

SNAPSHOT = ROOT / "tests" / "snapshots" / "mismatch_uneven_shards_eval_gather.json.gz"
RANKS_PER_AGENT = 3  # the snapshot's world size
JOB = "127.0.0.1:29500"  # any valid spec: a replaying agent ignores it
BATCH = 16  # agents started at once; each costs ~0.3 s of CPU to import and bind
FLAT_LIMIT = 2000  # agents a flat round over replaying agents finishes within 5 s + 1 s here
SERIAL_AT_MOST = 1000  # nodes the one-at-a-time timings visit; scaled to all of them
TOKEN = "bench-" + uuid.uuid4().hex  # what hosted agents require (--per-process)


def start_agents(n: int, tag: str, logs: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """N agents, batch by batch; returns them with their addresses once every one listens."""
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, OMP_NUM_THREADS="1")
    procs: list[subprocess.Popen] = []
    ports: list[str] = []
    for first in range(0, n, BATCH):
        batch = range(first, min(first + BATCH, n))
        for k in batch:
            cmd = [
                sys.executable,
                "-m",
                "hangdoc",
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--replay",
                str(SNAPSHOT),
                "--node-name",
                f"node{k}",
                "--replay-rank-offset",
                str(RANKS_PER_AGENT * k),
                "--replay-world-size",
                str(RANKS_PER_AGENT * n),
            ]
            with open(logs / f"agent{k}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
                    )
                )
        ports += [f"127.0.0.1:{wait_port(procs[k], logs / f'agent{k}.log')}" for k in batch]
    return procs, ports


def start_hosts(n: int, per: int, tag: str, logs: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """N agents in hosts of PER each (``--serve``); returns the hosts and the agents' addresses."""
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, OMP_NUM_THREADS="1")
    token_file = logs / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    procs: list[subprocess.Popen] = []
    for first in range(0, n, per):
        count = min(per, n - first)
        cmd = [
            sys.executable,
            __file__,
            "--serve",
            f"{first}:{count}",
            "--world",
            str(RANKS_PER_AGENT * n),
            "--token-file",
            str(token_file),
            "--per",
            str(per),
        ]
        with open(logs / f"host{first}.log", "w") as log:
            procs.append(
                subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            )
    ports: list[str] = []
    for first, proc in zip(range(0, n, per), procs, strict=False):
        # every host starts at once on the same cores: the last waits for all of them
        found = wait_ports(proc, logs / f"host{first}.log", timeout=60.0 + n * 0.02)
        ports += [f"{host_ip(first // per)}:{port}" for port in found]
    return procs, ports


def host_ip(host: int) -> str:
    """The loopback address host process HOST listens on: one each, as one address has
    only ~28,000 ephemeral ports (ip_local_port_range), fewer than 50,000 agents."""
    return f"127.0.{host // 250 + 1}.{host % 250 + 1}"


def wait_ports(proc: subprocess.Popen, log: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("hangdoc agents listening on ports "):
                return [int(p) for p in line.rsplit(" ", 1)[1].split(",")]
        if proc.poll() is not None:
            raise SystemExit(f"host exited ({proc.returncode}): {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit(f"host did not listen within {timeout:.0f} s: {log.read_text()[-2000:]}")


def serve_hosted(first: int, count: int, world: int, token_file: str, per: int) -> int:
    """``--serve FIRST:COUNT``: agents FIRST..FIRST+COUNT-1 in this process, each
    ``hangdoc.fleet.agent.serve`` (the server ``hangdoc agent --replay`` runs) on its own
    port, all on one event loop; prints their ports on one stderr line, runs until SIGTERM.
    Audit lines are off (no logging handler), as they would go to each node's own stderr."""
    from hangdoc.fleet.agent import AgentConfig, read_token, serve

    token = read_token(token_file)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        ports: dict[int, int] = {}
        tasks = []
        for k in range(first, first + count):
            config = AgentConfig(
                listen=f"{host_ip(first // per)}:0",
                token=token,
                host=f"node{k}",
                replay=str(SNAPSHOT),
                replay_rank_offset=RANKS_PER_AGENT * k,
                replay_world_size=world,
            )
            tasks.append(asyncio.create_task(serve(config, partial(ports.__setitem__, k), stop)))
            if len(tasks) % 64 == 0:
                await asyncio.sleep(0)  # let the started ones bind before the next batch
        while len(ports) < count:
            if failed := [t for t in tasks if t.done()]:
                await failed[0]  # raises its error
                raise SystemExit("an agent stopped before it listened")
            await asyncio.sleep(0.05)
        shown = ",".join(str(ports[k]) for k in range(first, first + count))
        print(f"hangdoc agents listening on ports {shown}", file=sys.stderr, flush=True)
        await stop.wait()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    return 0


def wait_port(proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("hangdoc agent listening on port "):
                return int(line.rsplit(" ", 1)[1])
        if proc.poll() is not None:
            raise SystemExit(f"agent exited ({proc.returncode}): {log.read_text()[-2000:]}")
        time.sleep(0.05)
    raise SystemExit(f"agent did not listen within {timeout:.0f} s: {log.read_text()[-2000:]}")


@contextmanager
def agents(n: int, per: int):
    """The ports of N running agents (PER to a process); all of them are killed on the way
    out, whatever happens."""
    tag = uuid.uuid4().hex
    logs = Path(tempfile.mkdtemp(prefix="hangdoc-fanout-"))
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.perf_counter()
        procs, ports = start_hosts(n, per, tag, logs) if per > 1 else start_agents(n, tag, logs)
        started = time.perf_counter() - t0
        rss = sum(psutil.Process(p.pid).memory_info().rss for p in procs)
        yield ports, started, rss, [psutil.Process(p.pid) for p in procs]
    finally:
        survivors = [psutil.Process(p.pid) for p in procs if p.poll() is None]
        for proc in survivors:
            proc.kill()
        psutil.wait_procs(survivors, timeout=10)
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(logs, ignore_errors=True)
        left = tagged(tag)
        if left:
            raise SystemExit(f"{len(left)} agent(s) survived: {[p.pid for p in left]}")


def round_bytes(fleet: Fleet, taken: Mapping[int, Sample]) -> int:
    """Protobuf bytes of one round on the wire (requests + responses, without gRPC framing)."""
    per_node: dict[int, list[int]] = {}
    for i, (node, _) in enumerate(fleet.placed):
        per_node.setdefault(id(node), []).append(i)
    total = 0
    for idx in per_node.values():
        procs = [fleet.placed[i][1] for i in idx]
        request = pb.SampleRequest(
            processes=pb.RankProcessList(processes=[wire.rank_process_to_proto(p) for p in procs]),
            t=1.0,
            native=False,
            timeout_seconds=5.0,
        )
        response = wire.samples_to_proto([(p.pid, taken[i]) for p, i in zip(procs, idx, strict=False)])
        total += request.ByteSize() + response.ByteSize()
    return total


def expected_culprits(n: int) -> list[int]:
    return [RANKS_PER_AGENT * k + 2 for k in range(n)]


def widened(options: CaptureOptions, n: int) -> CaptureOptions:
    """The options a flat round over N agents can finish under. A round's deadline is the
    dump timeout + ROUND_SLACK for the whole fan-out (queueing included): past ~2,000 agents
    on this machine a round of replaying agents takes longer, and every node still queued
    would be reported unreachable. Above that size the dump timeout goes to the most an agent
    accepts, so that the round can be timed at all."""
    return options if n <= FLAT_LIMIT else replace(options, timeout=MAX_DUMP_TIMEOUT)


def bench_size(
    n: int, per: int, repeat: int, options: CaptureOptions, profile: bool, windows: list[int]
) -> dict[str, object]:
    options = widened(options, n)
    auth = AgentAuth(token=TOKEN) if per > 1 else AgentAuth()
    with agents(n, per) as (ports, started, agents_rss, agent_procs):
        nodes = [RemoteNode(address, auth) for address in ports]
        try:
            t0 = time.perf_counter()
            fleet = find_ranks(nodes, parse_job_spec(JOB), deadline=options.timeout + 10.0 + n * 0.01)
            t_find = time.perf_counter() - t0
            assert len(fleet.placed) == RANKS_PER_AGENT * n and not fleet.unreachable, fleet.unreachable

            t0 = time.perf_counter()
            snapshot, diagnosis = observe(JOB, fleet, options, lambda _msg: None)
            t_watch = time.perf_counter() - t0
            t0 = time.perf_counter()
            analyse(snapshot)
            t_analyse = time.perf_counter() - t0
            culprits = list(diagnosis.culprit_ranks)
            verdict_ok = diagnosis.verdict.value == "collective_mismatch" and culprits == expected_culprits(n)
            rounds_in_watch = min(len(r.samples) for r in snapshot.ranks)

            rounds = []
            cpu0, agents0 = own_cpu(), agents_cpu(agent_procs)
            for _ in range(repeat):
                t0 = time.perf_counter()
                taken = sample_all(fleet, 1.0, native=False, timeout=options.timeout).samples
                rounds.append(time.perf_counter() - t0)
                assert len(taken) == len(fleet.placed), f"{len(taken)} samples of {len(fleet.placed)}"
            cpu_round = (own_cpu() - cpu0) / repeat
            agents_cpu_round = (agents_cpu(agent_procs) - agents0) / repeat
            parts = breakdown(fleet, taken, options)
            sources = time_sources(fleet, taken)
            prof = profile_round(fleet, options, threads=n > 1) if profile else ""
            sweep = sweep_windows(fleet, windows, repeat, options) if windows else []
            return {
                "n": n,
                "per": per,
                "ranks": len(fleet.placed),
                "start": started,
                "agents_rss": agents_rss,
                "find": t_find,
                "round": statistics.median(rounds),
                "rounds": rounds,
                "bytes": round_bytes(fleet, taken),
                "watch": t_watch,
                "beyond": t_watch - options.window,
                "watch_rounds": rounds_in_watch,
                "observed": snapshot.window_seconds,
                "analyse": t_analyse,
                "cpu": cpu_round,
                "agents_cpu": agents_cpu_round,
                **parts,
                "sources": sources,
                "verdict": diagnosis.verdict.value,
                "culprits": culprits,
                "verdict_ok": verdict_ok,
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "profile": prof,
                "sweep": sweep,
                "timeout": options.timeout,
            }
        finally:
            for node in nodes:
                node.close()


def sweep_windows(
    fleet: Fleet, windows: list[int], repeat: int, options: CaptureOptions
) -> list[tuple[int, float, float]]:
    """(calls in flight, median round wall, coordinator CPU per round) for each window."""
    out = []
    default = coordinator.MAX_IN_FLIGHT
    try:
        for window in windows:
            coordinator.MAX_IN_FLIGHT = window
            walls = []
            cpu0 = own_cpu()
            for _ in range(repeat):
                t0 = time.perf_counter()
                sample_all(fleet, 1.0, native=False, timeout=options.timeout)
                walls.append(time.perf_counter() - t0)
            out.append((window, statistics.median(walls), (own_cpu() - cpu0) / repeat))
    finally:
        coordinator.MAX_IN_FLIGHT = default
    return out


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def agents_cpu(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def breakdown(fleet: Fleet, taken: Mapping[int, Sample], options: CaptureOptions) -> dict[str, float]:
    """Where a round's time goes: one call at a time, decode alone, the thread pool alone."""
    per_node: dict[int, tuple[RemoteNode, list[int]]] = {}
    for i, (node, _) in enumerate(fleet.placed):
        per_node.setdefault(id(node), (node, []))[1].append(i)  # type: ignore[arg-type]
    visited = list(per_node.values())[:SERIAL_AT_MOST]
    t0 = time.perf_counter()
    for node, idx in visited:
        node.sample([fleet.placed[i][1] for i in idx], 1.0, native=False, timeout=options.timeout)
    serial = (time.perf_counter() - t0) * len(per_node) / len(visited)
    t0 = time.perf_counter()
    for _, idx in per_node.values():
        pb.SampleRequest(
            processes=pb.RankProcessList(processes=[wire.rank_process_to_proto(fleet.placed[i][1]) for i in idx])
        )
    encode = time.perf_counter() - t0
    responses = [
        wire.samples_to_proto([(fleet.placed[i][1].pid, taken[i]) for i in idx]) for _, idx in per_node.values()
    ]
    t0 = time.perf_counter()
    for response in responses:
        wire.samples_from_proto(response)
    decode = time.perf_counter() - t0
    empty = Fleet(tuple((node, fleet.placed[idx[0]][1]) for node, idx in per_node.values()), None)
    t0 = time.perf_counter()
    fan_out([node for node, _ in empty.placed], lambda node: None, None)
    pool = time.perf_counter() - t0
    return {"serial": serial, "encode": encode, "decode": decode, "pool": pool}


def time_sources(fleet: Fleet, taken: Mapping[int, Sample]) -> float:
    """What a diagnosis adds to its first round: one SampleSources call per node (every
    frame of every rank there, by pid), in sequence (timed over at most SERIAL_AT_MOST
    nodes, scaled to all)."""
    per_node: dict[int, tuple[Node, dict[int, list]]] = {}
    for i, sample in taken.items():
        node, proc = fleet.placed[i]
        frames = [f for th in sample.threads for f in th.frames]
        per_node.setdefault(id(node), (node, {}))[1].setdefault(proc.pid, []).extend(frames)
    visited = list(per_node.values())[:SERIAL_AT_MOST]
    t0 = time.perf_counter()
    for node, wanted in visited:
        node.sources(wanted)
    return (time.perf_counter() - t0) * len(per_node) / len(visited)


def profile_round(fleet: Fleet, options: CaptureOptions, threads: bool) -> str:
    """cProfile of one round in CPU time (``time.thread_time``, so a thread waiting for an
    answer or for the GIL costs nothing): the calling thread, and with ``threads`` every
    pool thread's calls too (one profiler per thread, merged), sorted by own time. What
    gRPC's own threads spend is in no profile: compare the total with the process's CPU."""
    profiles: list[cProfile.Profile] = []
    local = threading.local()
    original = RemoteNode.sample

    def profiled(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not hasattr(local, "prof"):
            local.prof = cProfile.Profile(time.thread_time)
            profiles.append(local.prof)
        local.prof.enable()
        try:
            return original(self, *args, **kwargs)
        finally:
            local.prof.disable()

    main = cProfile.Profile(time.thread_time)
    if threads:
        RemoteNode.sample = profiled  # type: ignore[method-assign]
    cpu0, t0 = own_cpu(), time.perf_counter()
    try:
        main.enable()
        sample_all(fleet, 1.0, native=False, timeout=options.timeout)
        main.disable()
    finally:
        RemoteNode.sample = original  # type: ignore[method-assign]
    cpu, wall = own_cpu() - cpu0, time.perf_counter() - t0
    out = io.StringIO()
    out.write(f"profiled round: {wall:.3f} s wall, {cpu:.3f} s CPU of the whole coordinator process\n")
    stats = pstats.Stats(main, stream=out)
    for prof in profiles:
        stats.add(prof)
    stats.sort_stats("tottime").print_stats(20)
    text = out.getvalue()
    for prefix in sorted(
        {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"], str(ROOT)}, key=len, reverse=True
    ):
        text = text.replace(prefix + "/", "")
    return text


def render(rows: list[dict[str, Any]], options: CaptureOptions, repeat: int, cmd: str, load_before: str) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    per = int(rows[0]["per"])
    hosting = (
        "Each agent is a separate "
        f"`python -m hangdoc agent --listen 127.0.0.1:0 --replay {SNAPSHOT.relative_to(ROOT)}` "
        f"process (one gRPC server per process, started {BATCH} at a time)"
        if per == 1
        else f"The agents run {per} to a process (`--per-process {per}`): each is "
        "`hangdoc.fleet.agent.serve`, the server `hangdoc agent --replay "
        f"{SNAPSHOT.relative_to(ROOT)}` runs, on its own port, {per} of them on one event loop, with a token "
        "(as an agent off loopback must have; without one every call would read the kernel's socket "
        "table, whose length grows with the number of connections on this one machine) and no audit "
        "lines"
    )
    lines = [
        "## Coordinator fan-out (issue 4)",
        "",
        (
            f"Produced by `{cmd}` on {platform.node()} ({os.cpu_count()} cores shared with other "
            f"work: load average {load_before} before the run, {load} at its end), "
            f"{time.strftime('%Y-%m-%d')}. {hosting}; agent K serves the 3-rank snapshot as ranks "
            "3K..3K+2 of a 3N-rank job. The agents replay, so the capture itself costs ~0: what is "
            "timed is the coordinator's fan-out, gRPC and protobuf decode, in one Python process "
            f"over loopback. Round: median of {repeat}. watch: window {options.window:.1f} s, "
            f"interval {options.interval:.1f} s. How the coordinator would reach 12,500 nodes and "
            "more: [docs/scale.md](scale.md)."
        ),
        "",
        (
            "| agents | ranks | agents up (s) | agents' RSS (MB) | find_ranks (s) "
            "| one sample_all round (s), median (min-max) "
            "| bytes per round | watch beyond the window (s) | rounds in watch | SampleSources, serial (s) "
            "| coordinator peak RSS (MB) | verdict (culprits) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        culprits = r["culprits"]
        shown = f"{culprits[:3]}...{culprits[-1]}" if len(culprits) > 4 else str(culprits)
        ok = "as expected" if r["verdict_ok"] else "UNEXPECTED"
        lines.append(
            f"| {r['n']:,} | {r['ranks']:,} | {r['start']:.1f} | {r['agents_rss'] / 2**20:.0f} | "
            f"{r['find']:.3f} | {r['round']:.3f} ({min(r['rounds']):.3f}-{max(r['rounds']):.3f}) | "
            f"{r['bytes']:,} | {r['beyond']:.2f} | "
            f"{r['watch_rounds']} | {r['sources']:.3f} | {r['maxrss'] / 2**20:.0f} | "
            f"{r['verdict']} {shown} ({len(culprits)} culprits, {ok}) |"
        )
    lines += [
        "",
        "Where the time goes (seconds; one round unless said otherwise; the agents run on the same",
        "2 cores as the coordinator, so on loopback their CPU is part of the round's wall time):",
        "",
        (
            "| agents | round, wall | coordinator CPU per round | coordinator CPU per agent (ms) "
            "| all agents' CPU per round | the same calls one node at a time | protobuf encode + decode alone "
            "| thread pool alone (no-op calls) | watch: last round ended at (s) | watch: analysis |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['round']:.3f} | {r['cpu']:.3f} | {float(r['cpu']) / int(r['n']) * 1000:.2f} | "
            f"{r['agents_cpu']:.3f} | "
            f"{r['serial']:.3f} | {r['encode']:.4f} + {r['decode']:.4f} | {r['pool']:.4f} | "
            f"{r['observed']:.2f} | "
            f"{r['analyse']:.3f} |"
        )
    for r in rows:
        if r["sweep"]:
            lines += [
                "",
                (
                    f"Calls in flight (`MAX_IN_FLIGHT`, the coordinator's thread pool) at {r['n']:,} agents, "
                    f"median of {repeat} rounds each:"
                ),
                "",
                "| calls in flight | round, wall (s) | coordinator CPU per round (s) |",
                "|---|---|---|",
                *(f"| {w} | {wall:.3f} | {cpu:.3f} |" for w, wall, cpu in r["sweep"]),
            ]
    lines += [
        "",
        "The bar: one sample round over 128 agents in under 1 s beyond the capture itself.",
        "",
        *findings(rows),
    ]
    if rows[-1]["profile"]:
        top = str(rows[-1]["profile"]).strip().splitlines()
        lines += [
            "",
            (
                f"Where the coordinator's CPU goes in one round at {rows[-1]['n']:,} agents (`--profile`: cProfile in "
                "CPU time, the calling thread and every pool thread merged; profiling itself slows the "
                "Python parts most):"
            ),
            "",
            "```",
            *[line.rstrip() for line in top if line.strip()][:20],
            "```",
        ]
    lines += [
        "",
        'Reading the table: "bytes per round" is the protobuf payload of all Sample requests',
        "and responses of one round, re-encoded here (gRPC/HTTP2 framing not counted);",
        '"protobuf encode" is building every node\'s process list anew, which a `RemoteNode`',
        "now does only when its processes change.",
        '"watch beyond the window" is the whole `observe()` minus its 2 s window: the last round,',
        "every round's source lines, and analysis; it also depends on where the last round falls:",
        "`watch` stops at the first round ending past the window, anywhere up to an interval later.",
        '"SampleSources, serial" is one round\'s worth of',
        "the source-line calls `watch` makes after each round, one node after the other.",
        f"The one-node-at-a-time columns visit at most {SERIAL_AT_MOST:,} nodes and are scaled to all.",
        *(
            [
                (
                    f"Above {FLAT_LIMIT:,} agents the dump timeout is {MAX_DUMP_TIMEOUT:g} s instead of "
                    f"{options.timeout:g} s: a round's deadline "
                    f"(dump timeout + {coordinator.ROUND_SLACK:g} s) covers the "
                    "whole fan-out, queueing included, and a flat round over that many agents takes longer "
                    "than 6 s here, so with the default every agent still queued would be reported unreachable "
                    "(as `find_ranks` at 12,500 agents was, under its default 15 s deadline)."
                )
            ]
            if any(int(r["n"]) > FLAT_LIMIT for r in rows)
            else []
        ),
        "Peak RSS is `ru_maxrss`, which only grows: sizes run ascending, so each row is the peak",
        "up to and including that size.",
        "",
    ]
    return "\n".join(lines)


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """What the numbers of the smallest and largest size say, in sentences."""
    small, big = rows[0], rows[-1]
    n = int(big["n"])
    f = {k: float(v) for k, v in big.items() if isinstance(v, (int, float))}
    verdict = "meets" if f["round"] < 1.0 else "misses"
    per_agent = f["cpu"] / n
    return [
        (
            f"At {n:,} agents one round takes {f['round']:.3f} s (the bar is for 128 agents: it {verdict} "
            f"1 s at this size). The coordinator's own CPU is {f['cpu']:.3f} s of it "
            f"(~{per_agent * 1000:.2f} ms per agent): decoding the answers into model values takes "
            f"{f['decode']:.3f} s of it, the thread pool {f['pool']:.3f} s (building the process lists, "
            f"{f['encode']:.3f} s, is paid on a node's first round only). "
            f"The same calls one node at a time cost {f['serial'] / n * 1000:.1f} ms each, of which "
            f"encode + decode are {(f['encode'] + f['decode']) / n * 1000:.2f} ms: the rest is gRPC's own "
            "work per call and waiting for the agent's answer; the agents' own CPU "
            f"({f['agents_cpu']:.3f} s per round) shares the coordinator's 2 cores here, which it would "
            "not on a real cluster, so loopback overstates the round."
        ),
        "",
        (
            f"At 12,500 nodes (100,000 GPUs, 8 a node) one flat round costs the coordinator "
            f"~{per_agent * 12_500:.1f} s of CPU at this rate, however many calls are in flight: above the "
            "5 s a round may take. [docs/scale.md](scale.md) plans the relay tree that spreads it."
        ),
        "",
        (
            f"What `watch` adds: source lines. Asked one node after the other they would cost "
            f'{f["sources"]:.3f} s at {n:,} agents (the "SampleSources, serial" column); `watch` asks '
            "all nodes at once and only for (file, line) pairs it has not fetched from that node "
            "before, so only the first round pays, and rounds start on a fixed tick "
            f"(`t0 + k * interval`). `watch` took {counted(big['watch_rounds'], 'round')} in its 2 s window at {n:,} "
            f"agents, {small['watch_rounds']} at {small['n']:,} agents."
        ),
    ]


_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}:\d+\b")
SHOWN_LOST = 5  # unreachable nodes shown with their own reason, per row


class LostReasons:
    """Why nodes were lost, by stage: the first few (node and reason as the coordinator
    said it) and a count per reason with the addresses in it replaced by ``ADDR``, so that
    one lost node among thousands explains itself in the table."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: list[str] = []

    def add(self, stage: str, lost: Sequence[Unreachable]) -> None:
        for node in lost:
            key = f"{stage}: {_ADDRESS.sub('ADDR', node.reason)}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if len(self.first) < SHOWN_LOST:
                self.first.append(f"{stage}: {node.target}: {node.reason}")

    def lines(self) -> list[str]:
        by_count = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return [f"lost {count}x {key}" for key, count in by_count] + [f"e.g. {one}" for one in self.first]


def bench_modes(
    n: int, per: int, repeat: int, options: CaptureOptions, modes: list[str], connect_timeout: float | None = None
) -> list[dict[str, Any]]:
    """``--tree``: over the same N hosted agents, each of ``modes`` ("flat": every call from
    the coordinator; "tree": through relays, ``fleet.tree``) in turn, fresh ``RemoteNode``s
    each: find_ranks, one whole ``observe()`` (the diagnosis after discovery), ``repeat``
    sample rounds; wall time, the coordinator's CPU and the agents' (relays included)."""
    options = widened(options, n)
    auth = AgentAuth(token=TOKEN)
    rows = []
    default_at = tree.TREE_AT
    with agents(n, per) as (ports, _started, _rss, agent_procs):
        for mode in modes:
            tree.TREE_AT = default_at if mode == "tree" else 10**9
            if mode == "tree" and n <= default_at:
                tree.TREE_AT = 1  # below the threshold: forced, to compare
            # above FLAT_LIMIT every per-call deadline is widened like the dump timeout: with all
            # relays' calls in flight at once on 2 cores, a first FindRanks can wait past 15 s
            connect = connect_timeout or (5.0 if n <= FLAT_LIMIT else 60.0)
            nodes = [RemoteNode(address, auth, connect_timeout=connect) for address in ports]
            try:
                cpu0, agents0, t0 = own_cpu(), agents_cpu(agent_procs), time.perf_counter()
                fleet = find_ranks(nodes, parse_job_spec(JOB), deadline=options.timeout + 10.0 + n * 0.01)
                t_find, cpu_find = time.perf_counter() - t0, own_cpu() - cpu0
                agents_find = agents_cpu(agent_procs) - agents0
                found_ok = len(fleet.placed) == RANKS_PER_AGENT * n and not fleet.unreachable
                cpu0, agents0, t0 = own_cpu(), agents_cpu(agent_procs), time.perf_counter()
                snapshot, diagnosis = observe(JOB, fleet, options, lambda _msg: None)
                t_watch, cpu_watch = time.perf_counter() - t0, own_cpu() - cpu0
                agents_watch = agents_cpu(agent_procs) - agents0
                culprits = list(diagnosis.culprit_ranks)
                rounds, lost = [], 0
                why = LostReasons()
                why.add("find", fleet.unreachable)
                why.add("observe", snapshot.unreachable)
                cpu0, agents0 = own_cpu(), agents_cpu(agent_procs)
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    taken = sample_all(fleet, 1.0, native=False, timeout=options.timeout)
                    rounds.append(time.perf_counter() - t0)
                    lost += len(taken.lost)
                    why.add("round", taken.lost)
                rows.append(
                    {
                        "n": n,
                        "mode": mode,
                        "find": t_find,
                        "cpu_find": cpu_find,
                        "agents_find": agents_find,
                        "found_ok": found_ok,
                        "unreachable_find": len(fleet.unreachable),
                        "watch": t_watch,
                        "cpu_watch": cpu_watch,
                        "agents_watch": agents_watch,
                        "watch_rounds": min(len(r.samples) for r in snapshot.ranks),
                        "unreachable_watch": len(snapshot.unreachable),
                        "round": statistics.median(rounds),
                        "rounds": rounds,
                        "lost": lost,
                        "cpu": (own_cpu() - cpu0) / repeat,
                        "agents_cpu": (agents_cpu(agent_procs) - agents0) / repeat,
                        "verdict": diagnosis.verdict.value,
                        "verdict_ok": diagnosis.verdict.value == "collective_mismatch"
                        and culprits == expected_culprits(n),
                        "timeout": options.timeout,
                        "why_lost": why.counts,
                        "lost_first": why.first,
                    }
                )
                print({k: v for k, v in rows[-1].items() if k != "rounds"}, file=sys.stderr, flush=True)
                for line in why.lines():
                    print(f"  {mode}: {line}", file=sys.stderr, flush=True)
            finally:
                tree.TREE_AT = default_at
                for node in nodes:
                    node.close()
    return rows


def render_modes(rows: list[dict[str, Any]], repeat: int, cmd: str, load_before: str) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"`{cmd}` on {platform.node()} ({os.cpu_count()} cores shared with other work: load average "
        f"{load_before} before, {load} after), {time.strftime('%Y-%m-%d %H:%M')}. Agents hosted "
        f"{rows[0].get('per', '')} to a process on the coordinator's own cores (relays are agents of "
        f"those processes); rounds: median of {repeat}; observe: window 2.0 s, interval 0.5 s. "
        'CPU in seconds; "agents" is every agent process\'s CPU, relays included.',
        "",
        "| agents | mode | find_ranks (s) | its coordinator CPU | its agents CPU | observe() (s) | its coordinator CPU "
        "| its agents CPU | rounds in it | one round (s) | coordinator CPU a round | agents CPU a round "
        "| nodes lost (find / observe / rounds) | why lost | dump timeout (s) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "as expected" if r["verdict_ok"] else "UNEXPECTED"
        lines.append(
            f"| {r['n']:,} | {r['mode']} | {r['find']:.2f} | {r['cpu_find']:.2f} | {r['agents_find']:.2f} "
            f"| {r['watch']:.2f} | {r['cpu_watch']:.2f} | {r['agents_watch']:.2f} | {r['watch_rounds']} "
            f"| {r['round']:.2f} ({min(r['rounds']):.2f}-{max(r['rounds']):.2f}) | {r['cpu']:.2f} "
            f"| {r['agents_cpu']:.2f} | {r['unreachable_find']} / {r['unreachable_watch']} / {r['lost']} "
            f"| {why_cell(r['why_lost'])} | {r['timeout']:g} | {r['verdict']} ({ok}) |"
        )
    if examples := [f"- {r['n']:,} {r['mode']}: {one}" for r in rows for one in r["lost_first"]]:
        lines += ["", "Lost nodes, the first of each row:", "", *examples]
    return "\n".join(lines)


def why_cell(counts: Mapping[str, int]) -> str:
    """The reasons nodes were lost, most frequent first, for one table cell."""
    if not counts:
        return "—"
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = "; ".join(f"{count}x {key}" for key, count in ranked[:3])
    return (shown + (f"; {len(ranked) - 3} other reasons" if len(ranked) > 3 else "")).replace("|", "\\|")


def write_section(path: Path, text: str) -> None:
    """Append (or replace) this section; the file's other sections stay as they are."""
    from docs_section import write_section as write

    write(path, "## Coordinator fan-out (issue 4)", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,128")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="a CPU profile of one round at the largest size (printed, and written with --write)",
    )
    parser.add_argument("--write", metavar="FILE", help="append the markdown section to this file")
    parser.add_argument(
        "--per-process",
        type=int,
        default=1,
        metavar="K",
        help="host K agents in each agent process (default 1: one `hangdoc agent` each)",
    )
    parser.add_argument(
        "--in-flight",
        default="",
        metavar="W,W,...",
        help="also time rounds with these many calls in flight (the coordinator's MAX_IN_FLIGHT)",
    )
    parser.add_argument(
        "--in-flight-at", type=int, metavar="N", help="the one size to time --in-flight at (default: every size)"
    )
    parser.add_argument(
        "--tree",
        nargs="?",
        const="flat,tree",
        metavar="MODES",
        help="compare fan-out modes over the same agents (default flat,tree: every call from the "
        "coordinator, then through relays) instead of the flat breakdown; prints a table",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        metavar="S",
        help="with --tree: each RemoteNode's connect timeout (GetInfo; FindRanks gets 10 s more); "
        f"default 5 s, 60 s above {FLAT_LIMIT:,} agents",
    )
    parser.add_argument("--serve", metavar="FIRST:COUNT", help=argparse.SUPPRESS)  # a host process
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--token-file", help=argparse.SUPPRESS)
    parser.add_argument("--per", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        first, count = (int(x) for x in args.serve.split(":"))
        return serve_hosted(first, count, args.world, args.token_file, args.per)
    options = CaptureOptions(window=2.0, interval=0.5)
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    sizes = sorted(int(s) for s in args.sizes.split(","))
    windows = [int(w) for w in args.in_flight.split(",") if w]
    if args.tree:
        if args.per_process < 2:
            raise SystemExit("--tree needs --per-process K (hosted agents with a token: relays serve operators only)")
        found = []
        for n in sizes:
            print(f"fan-out modes {args.tree} at {n} agents ...", file=sys.stderr, flush=True)
            found += [
                dict(r, per=args.per_process)
                for r in bench_modes(
                    n, args.per_process, args.repeat, options, args.tree.split(","), args.connect_timeout
                )
            ]
        cmd = "python bench/bench_fanout.py " + " ".join(sys.argv[1:])
        print(render_modes(found, args.repeat, cmd.strip(), load_before))
        return 0 if all(r["verdict_ok"] for r in found) else 1
    tree.TREE_AT = 10**9  # the flat fan-out this section measures (--tree compares both)
    for n in sizes:
        print(f"fan-out to {n} agents ...", file=sys.stderr, flush=True)
        rows.append(
            bench_size(
                n,
                args.per_process,
                args.repeat,
                options,
                args.profile and n == sizes[-1],
                windows if args.in_flight_at in (None, n) else [],
            )
        )
        shown = {k: v for k, v in rows[-1].items() if k not in ("profile", "culprits", "rounds")}
        print(shown, file=sys.stderr, flush=True)
        if rows[-1]["profile"]:
            print(rows[-1]["profile"], file=sys.stderr, flush=True)
    cmd = "python bench/bench_fanout.py " + " ".join(sys.argv[1:])
    text = render(rows, options, args.repeat, cmd.strip(), load_before)
    print(text)
    if args.write:
        write_section(Path(args.write), text)
    return 0 if all(r["verdict_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
