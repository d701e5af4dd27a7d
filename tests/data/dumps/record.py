"""Record the dump fixtures of ``tests/data/dumps/`` from real hung jobs of the corpus.

Run once, by hand, when py-spy's output format changes (``.venv/bin/python
tests/data/dumps/record.py``); the outputs are committed and read by
``tests/unit/capture/dumps/test_dumpfile.py``. Each job is launched as the corpus harness launches it
(``tests/support/harness.py``), or, where a fixture needs rank hints on the command line,
with ``--local_rank=N`` appended the way DeepSpeed's launcher passes it; py-spy runs as a
user would run it by hand, through bash, and its output is written as it comes. Every
process started here is killed at the end (whole process groups).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent.parent
sys.path.insert(0, str(TESTS))

from support.harness import free_port, launch, load_meta

PYSPY = str(Path(sys.executable).parent / "py-spy")
JOBS = TESTS / "jobs"


def sh(command: str, out: Path) -> None:
    """Run ``command`` in bash with its stdout (py-spy's dumps) written to ``out``."""
    with out.open("wb") as handle:
        subprocess.run(["bash", "-c", command], stdout=handle, stderr=subprocess.DEVNULL,
                       check=True)
    print(f"wrote {out.relative_to(TESTS.parent)} ({out.stat().st_size} bytes)")


def ready_pids(ready: Path, ranks: range) -> dict[int, int]:
    return {r: int((ready / f"ready.{r}").read_text()) for r in ranks}


def wait_ready(ready: Path, ranks: range, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not all((ready / f"ready.{r}").exists() for r in ranks):
        if time.monotonic() > deadline:
            raise SystemExit(f"ranks not ready after {timeout:.0f}s")
        time.sleep(0.2)


def harness_job(name: str, record) -> None:  # type: ignore[no-untyped-def]
    meta = load_meta(JOBS / f"{name}.py")
    with tempfile.TemporaryDirectory() as tmp, launch(meta, Path(tmp)) as job:
        job.wait_ready(150)
        time.sleep(max(meta.settle, 2.0))
        record(ready_pids(job.ready_dir, range(meta.nproc)))


def direct_job_with_rank_flags(name: str, nproc: int, record) -> None:  # type: ignore[no-untyped-def]
    """Start ``name`` once per rank, ``--local_rank=N`` on each command line (the script
    ignores its arguments), each in its own session; kill the sessions at the end."""
    script = JOBS / f"{name}.py"
    port = free_port()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp)
        try:
            for rank in range(nproc):
                env = {k: v for k, v in os.environ.items()
                       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
                env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                           LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), HANGDOC_READY_DIR=str(ready),
                           OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
                argv = [sys.executable, "-u", str(script), f"--local_rank={rank}"]
                procs.append(subprocess.Popen(argv, env=env, cwd=JOBS, start_new_session=True,
                                              stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            wait_ready(ready, range(nproc))
            time.sleep(3.0)
            record(ready_pids(ready, range(nproc)))
        finally:
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def dumps(pids: list[int], *flags: str) -> str:
    """A bash loop that dumps ``pids`` in that order, as a user would."""
    args = " ".join(shlex.quote(f) for f in flags)
    return f"for p in {' '.join(map(str, pids))}; do {PYSPY} dump --pid $p {args}; done"


def record_mismatch_wrapper(pids: dict[int, int]) -> None:
    by_pid = sorted(pids.values())  # `pgrep -P <torchrun>` order
    sh(dumps(by_pid), HERE / "mismatch_wrapper_two_callers.txt")
    sh(dumps(by_pid, "--locals"), HERE / "mismatch_wrapper_two_callers_locals.txt")
    # several --json dumps slurped into one JSON list, as `... | jq -s .` would
    raw = HERE / "mismatch_wrapper_two_callers_concatenated.json.tmp"
    sh(dumps(by_pid, "--json"), raw)
    text, decoder, values, i = raw.read_text(), json.JSONDecoder(), [], 0
    while text[i:].strip():
        i += len(text[i:]) - len(text[i:].lstrip())
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    raw.unlink()
    out = HERE / "mismatch_wrapper_two_callers_list.json"
    out.write_text(json.dumps(values, indent=1) + "\n")
    print(f"wrote {out.relative_to(TESTS.parent)} ({out.stat().st_size} bytes)")


def record_straggler(pids: dict[int, int]) -> None:
    # ranks dumped in reverse order, their rank on each command line (--local_rank=N)
    order = [pids[r] for r in sorted(pids, reverse=True)]
    sh(dumps(order, "--native"), HERE / "straggler_forked_worker_lock_native.txt")
    # every process running the script, DataLoader workers included, in pid order
    pattern = "[s]traggler_forked_worker_lock.py --local_rank"  # [s]: not this shell itself
    sh(f"for p in $(pgrep -f '{pattern}' | sort -n); do {PYSPY} dump --pid $p; done",
       HERE / "straggler_forked_worker_lock_all_processes.txt")


def record_pipeline(pids: dict[int, int]) -> None:
    # the manual loop with a label line per rank, then --json --locals dumps concatenated
    labelled = "; ".join(f"echo '=== rank {r} (pid {p}) ==='; {PYSPY} dump --pid {p} --locals"
                         for r, p in sorted(pids.items()))
    sh(labelled, HERE / "mismatch_pipeline_short_last_batch_p2p_labelled.txt")
    sh(dumps([pids[r] for r in sorted(pids)], "--json", "--locals"),
       HERE / "mismatch_pipeline_short_last_batch_p2p.json")


def record_not_hung(pids: dict[int, int]) -> None:
    order = [pids[r] for r in sorted(pids)]
    sh(f"{dumps(order)}; sleep 1; {dumps(order)}", HERE / "not_hung_fast_steps_two_rounds.txt")


def record_ray_stack() -> None:
    """The plain-actors job of ``tests/jobs/ray/actors_hang.py`` (w0 broadcasts while w1 and
    w2 all_reduce) on a private one-node Ray instance, then the real ``ray stack``. It runs
    ``sudo py-spy``: a shim that runs its arguments stands in for sudo (this runs as root).
    Run it only when no other Ray runs on the machine: ``ray stack`` dumps every Ray worker
    it finds in ``ps``."""
    import ray

    sys.path.insert(0, str(JOBS / "ray"))
    import actors_hang  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory(prefix="hdray") as tmp:
        shim = Path(tmp, "bin")
        shim.mkdir()
        (shim / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
        (shim / "sudo").chmod(0o755)
        ready = Path(tmp, "ready")
        ready.mkdir()
        # the workers import actors_hang as the driver does; no token file in ~/.ray, no
        # usage stats (as tests/support/raycluster.py starts its clusters)
        os.environ["PYTHONPATH"] = str(JOBS / "ray")
        os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                          RAY_DISABLE_DOCKER_CPU_WARNING="1")
        ray.init(_temp_dir=str(Path(tmp, "ray")), include_dashboard=False, num_cpus=2,
                 log_to_driver=False)
        try:
            port = free_port()
            workers = [actors_hang.Worker.options(name=f"w{i}").remote(i, port, str(ready))
                       for i in range(actors_hang.WORLD)]
            calls = [w.train.remote("mismatch") for w in workers]
            wait_ready(ready, range(actors_hang.WORLD))
            time.sleep(3.0)
            env = {**os.environ, "PATH": f"{shim}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
            out = HERE / "ray_stack_actors_mismatch.txt"
            with out.open("wb") as handle:
                subprocess.run([str(Path(sys.executable).parent / "ray"), "stack"], env=env,
                               stdout=handle, stderr=subprocess.DEVNULL, check=True)
            print(f"wrote {out.relative_to(TESTS.parent)} ({out.stat().st_size} bytes)")
            del calls
        finally:
            ray.shutdown()


STEPS = {
    "ray": record_ray_stack,
    "mismatch_wrapper": lambda: harness_job("mismatch_wrapper_two_callers",
                                            record_mismatch_wrapper),
    "straggler": lambda: direct_job_with_rank_flags("straggler_forked_worker_lock", 3,
                                                    record_straggler),
    "pipeline": lambda: harness_job("mismatch_pipeline_short_last_batch_p2p", record_pipeline),
    "not_hung": lambda: harness_job("not_hung_fast_steps", record_not_hung),
}


def main() -> None:
    """Record every fixture, or those named on the command line (keys of ``STEPS``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in sys.argv[1:] or list(STEPS):
        STEPS[name]()


if __name__ == "__main__":
    main()
