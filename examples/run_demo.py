"""``make demo``: start the hung demo job under torchrun, diagnose it, clean up.

Starts ``examples/demo_train.py`` on 4 ranks (gloo, CPU), waits until every rank has
reached the point where it hangs, runs ``hangdoc diagnose pid:<torchrun>`` and prints
the report, then kills the job and all its workers (torchrun puts them in sessions of
their own, so they are found by an environment tag, not by process group).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
NPROC = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("HANGDOC_DEMO_TAG") == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_all(launcher: subprocess.Popen, tag: str) -> None:
    procs = tagged(tag)
    try:
        procs += psutil.Process(launcher.pid).children(recursive=True)
    except psutil.Error:
        pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    launcher.kill()
    launcher.wait()
    psutil.wait_procs(procs, timeout=10)


def main(argv: list[str]) -> int:
    tag = uuid.uuid4().hex
    ready = Path(tempfile.mkdtemp(prefix="hangdoc-demo-"))
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, HANGDOC_READY_DIR=str(ready), OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", str(NPROC), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(HERE / "demo_train.py")]
    print(f"$ {' '.join(cmd)}", file=sys.stderr)
    log = open(ready / "job.log", "w")  # noqa: SIM115 - the child writes to it for its whole life
    launcher = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(list(ready.glob("ready.*"))) < NPROC:
            if launcher.poll() is not None or time.monotonic() > deadline:
                print((ready / "job.log").read_text()[-3000:], file=sys.stderr)
                print("demo job did not reach its hang", file=sys.stderr)
                return 1
            time.sleep(0.2)
        time.sleep(1.0)
        print(f"$ hangdoc diagnose pid:{launcher.pid} {' '.join(argv)}", file=sys.stderr)
        return subprocess.call([sys.executable, "-m", "hangdoc", "diagnose", f"pid:{launcher.pid}", *argv])
    finally:
        kill_all(launcher, tag)
        left = tagged(tag)
        if left:
            print(f"warning: {len(left)} demo process(es) survived", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
