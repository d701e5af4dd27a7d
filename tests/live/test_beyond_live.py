"""Hangs that sit past the ranks (``tests/jobs/beyond/``): an inference server whose
scheduler deadlocked, a reward service every rank waits on, a child process, a DataLoader
worker on a read that never returns, a file-lock cycle across processes; and healthy RL
loops. Each job really hangs (or runs) under torch.distributed with gloo; the test runs
``python -m hangdoc diagnose JOB --json`` against it and checks the verdict, the culprits
and the root cause: the process (by its command line, never one of the ranks) and thread
the job's third header line names (``# hangdoc-root: cmd=WORD thread=NAME``, or ``none``).

The jobs measure no timing, so they run side by side (the healthy ones two at a time, then
the hung ones three at a time): the suite's time is the CI's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.agents import start_agent
from support.harness import JobMeta, corpus, launch
from support.paths import REPO

BEYOND = REPO / "tests" / "jobs" / "beyond"
_ROOT = "# hangdoc-root:"


def _root(meta: JobMeta) -> dict[str, str] | None:
    for line in meta.path.read_text().splitlines()[:5]:
        if line.startswith(_ROOT):
            words = line[len(_ROOT) :].split()
            return None if words == ["none"] else dict(w.split("=", 1) for w in words)
    raise AssertionError(f"{meta.path}: no {_ROOT} line")


# a job also diagnosed through a real agent (gRPC, a token): its Waits call and the Sample
# of the processes it named
VIA_AGENT = "straggler_rollout_server_scheduler_deadlock"
# a straggler stays ambiguous (it may be slow) up to --max-window; what is checked here does
# not depend on how long it is watched past 4 s
FAST = ("--max-window", "4")
# jobs diagnosed with --include: a healthy loop's server is sampled though no rank waits on it
INCLUDE = {"not_hung_rl_loop_with_server": ("--include=--serve",)}
TOKEN = "beyond-token-0123456789abcdef"


def _diagnose(spec: str, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hangdoc", "diagnose", spec, "--json", *FAST, *args]
    if record := os.environ.get("HANGDOC_RECORD_DIR"):
        Path(record, "beyond").mkdir(parents=True, exist_ok=True)
        argv += ["--save", str(Path(record, "beyond", f"{name}.json.gz"))]
    return subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=150, cwd=REPO, stdin=subprocess.DEVNULL
    )


def _via_agent(spec: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    token = workdir / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    with start_agent(workdir, "--listen", "127.0.0.1:0", "--token-file", str(token), "--node-name", "node-a") as agent:
        argv = [sys.executable, "-m", "hangdoc", "diagnose", spec, "--json", "-q", *FAST]
        argv += ["--agents", agent.address, "--token-file", str(token)]
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=150, cwd=REPO, stdin=subprocess.DEVNULL
        )


def _run(meta: JobMeta, workdir: Path) -> tuple[dict, dict[int, str], str, dict | None]:
    """The report of a diagnosis of the running job, each of its processes' command line
    while it ran, what the job printed, and the report through an agent (``VIA_AGENT``)."""
    agent_report = None
    with launch(meta, workdir / "job") as job:
        job.wait_ready()
        result = _diagnose(job.job_spec(), meta.name, *INCLUDE.get(meta.name, ()))
        if meta.name == VIA_AGENT:
            through = _via_agent(job.job_spec(), workdir)
            agent_report = json.loads(through.stdout) if through.stdout.strip() else {"stderr": through.stderr}
        commands = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    commands[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
        output = job.output()
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"{meta.name}: exit {result.returncode}\n{result.stderr[-3000:]}\n--- job ---\n{output[-3000:]}")
    return report, commands, output, agent_report


@pytest.fixture(scope="module")
def reports(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[JobMeta, dict, dict[int, str], str, dict | None]]:
    metas = corpus(BEYOND)
    runs = {}
    # healthy jobs must move while they are watched: two at a time, before the hung ones;
    # a hung job needs no CPU once it hangs: three at a time
    for phase, workers in (
        ([m for m in metas if m.verdict == "not_hung"], 2),
        ([m for m in metas if m.verdict != "not_hung"], 3),
    ):
        with ThreadPoolExecutor(max_workers=workers) as pool:
            started = {m.name: pool.submit(_run, m, tmp_path_factory.mktemp(m.name)) for m in phase}
            runs.update({name: future.result() for name, future in started.items()})
    return {m.name: (m, *runs[m.name]) for m in metas}


def _explain(report: dict) -> str:
    return json.dumps(
        {k: report.get(k) for k in ("verdict", "culprit_ranks", "summary", "evidence", "root_cause", "ranks")},
        indent=1,
    )[:6000]


@pytest.mark.live
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(m.name for m in corpus(BEYOND)))
def test_the_wait_is_followed_to_the_process_that_holds_it(reports, name: str) -> None:
    meta, report, commands, _output, _agent = reports[name]
    assert report["verdict"] == meta.verdict, _explain(report)
    assert report["culprit_ranks"] == sorted(meta.culprits), _explain(report)
    expected = _root(meta)
    root = report["root_cause"]
    if expected is None:
        assert root is None, _explain(report)
        return
    assert root is not None, _explain(report)
    rank_pids = {r["pid"] for r in report["ranks"] if r.get("pid")}
    assert root["pid"] not in rank_pids, _explain(report)
    assert expected["cmd"] in commands.get(root["pid"], ""), _explain(report)
    assert root["thread"] == expected["thread"], _explain(report)
    assert root["chain"][-1]["pid"] == root["pid"]
    first = root["chain"][0]
    assert first["rank"] is not None and first["pid"] in rank_pids, _explain(report)
    said = " ".join(report["evidence"])
    assert f"pid {root['pid']}" in said and "the wait ends at" in said, said
    assert f"py-spy dump --pid {root['pid']}" in report["next_steps"][0]


@pytest.mark.live
@pytest.mark.timeout(600)
def test_an_agent_follows_the_wait_to_the_same_process(reports) -> None:
    """Through a real agent (gRPC, token): the Waits call, then Sample of the processes it
    named (which the agent refuses unless a Waits answer named them)."""
    _meta, local, _commands, _output, through = reports[VIA_AGENT]
    assert through is not None and "root_cause" in through, through
    assert through["verdict"] == local["verdict"] and through["culprit_ranks"] == local["culprit_ranks"]
    assert through["root_cause"] is not None, _explain(through)
    for key in ("pid", "thread", "frame", "command"):
        assert through["root_cause"][key] == local["root_cause"][key], key
    assert through["root_cause"]["host"] == "node-a"


@pytest.mark.live
@pytest.mark.timeout(600)
def test_include_samples_a_server_no_rank_waits_on(reports) -> None:
    _meta, report, commands, _output, _agent = reports["not_hung_rl_loop_with_server"]
    assert report["verdict"] == "not_hung" and report["root_cause"] is None
    servers = [p for p in report["other_processes"] if "--serve" in " ".join(p["command"])]
    assert len(servers) == 1 and servers[0]["sampled"] == 2 and "scheduler" in servers[0]["threads"], report
    assert "--serve" in commands[servers[0]["pid"]]
