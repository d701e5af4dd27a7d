"""``make demo``: start the hung demo job under torchrun, diagnose it, show the fix, clean up.

Says first what is wrong with the job (it is broken on purpose: rank 3 is one step off),
starts ``examples/demo_train.py`` on 4 ranks (gloo, CPU), waits until every rank has
reached the point where it hangs, runs ``hangdoc diagnose pid:<torchrun>`` and prints the
report, then shows the fix the report points to: the line of ``demo_train.py`` that
decides rank 3's path, the line that is wrong, and what to change (``the_fix``, read from
the JSON report of the saved snapshot, so what is shown is what hangdoc found). Finally it
kills the job and all its workers (torchrun puts them in sessions of their own, so they
are found by an environment tag, not by process group) and removes its scratch directory
(the job's log and ready files). The snapshot is kept where the demo says it saved it:
``ARGS``' own ``--save FILE``, else ``kept_snapshot()`` in the temporary directory, one
file per user that each run replaces.

``examples/watch_demo.py`` (``make watch-demo``) tells the same story under ``hangdoc watch``.
Its narrative goes to stderr, so ``make demo ARGS=--json`` still prints one JSON object on
stdout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "demo_train.py"
NPROC = 4
WIDTH = 80  # the narrative is wrapped to this many columns
BUG_MARK = "# the bug"  # the comment on the wrong line of demo_train.py
GATE = "step % LOG_EVERY == 0"  # the line that sends a rank to the metrics all_gather
FIXED = "start_step = 0"  # what the wrong line's code should be


def say(text: str = "", indent: int = 0) -> None:
    """A paragraph of the demo's story on stderr, wrapped to ``WIDTH`` columns."""
    print("\n".join(wrap(text, indent)) if text else "", file=sys.stderr, flush=True)


def wrap(text: str, indent: int = 0) -> list[str]:
    """``text`` in lines of ``WIDTH`` columns; paths and words are never cut."""
    pad = " " * indent
    return textwrap.wrap(
        text, WIDTH, initial_indent=pad, subsequent_indent=pad, break_long_words=False, break_on_hyphens=False
    )


def source_line(needle: str) -> tuple[int, str]:
    """The number and text of the first line of demo_train.py that contains ``needle``."""
    for number, line in enumerate(TRAIN.read_text().splitlines(), 1):
        if needle in line:
            return number, line
    raise LookupError(f"{TRAIN.name} has no line with {needle!r}")


def quoted(number: int, line: str) -> str:
    return f"    {number:>3} | {line.rstrip()}"


def intro() -> None:
    number, line = source_line(BUG_MARK)
    say(
        "This demo starts a 4-rank training job (examples/demo_train.py, gloo on CPU) that is "
        f"broken on purpose: rank 3 is one step off. It resumed with another step offset "
        f"({TRAIN.name}:{number}):"
    )
    print(quoted(number, line.split(BUG_MARK)[0]), file=sys.stderr)
    say(
        "so every few steps rank 3 goes to gather the logged losses while ranks 0-2 go to "
        "all-reduce the gradients, and every rank waits forever. hangdoc is told none of "
        "this: it is given torchrun's pid and reads the ranks' stacks."
    )
    say()


def the_fix(report: dict) -> list[str] | None:
    """The fix the report points to, as lines of at most ``WIDTH`` columns; None when the
    report does not name the planted bug (another verdict, another culprit)."""
    culprits = report.get("culprit_ranks")
    ranks = {r.get("rank"): r for r in report.get("ranks", [])}
    culprit_op = (ranks.get(3) or {}).get("op") or {}
    others = sorted(
        {
            (r["op"]["name"], r["op"]["call_site"])
            for n, r in ranks.items()
            if n != 3 and r.get("op") and r["op"].get("call_site")
        }
    )
    if report.get("verdict") != "collective_mismatch" or culprits != [3] or not culprit_op or not others:
        return None
    gate_number, gate = source_line(GATE)
    bug_number, bug = source_line(BUG_MARK)
    code = bug.split(BUG_MARK)[0].rstrip()
    indent = code[: len(code) - len(code.lstrip())]
    where = " and ".join(f"{name} ({site})" for name, site in others)
    lines = wrap(
        f"hangdoc named rank 3: it waits in {culprit_op['name']} ({culprit_op['call_site']}, "
        f"in {culprit_op['function']}) while ranks 0-2 wait in {where}. Rank 3 went to gather "
        f"the losses when the others did not. That is decided by the step number "
        f"({TRAIN.name}:{gate_number}):"
    )
    lines.append(quoted(gate_number, gate))
    lines += wrap(f"so rank 3 counts steps differently. Its count starts at {TRAIN.name}:{bug_number}:")
    lines.append(quoted(bug_number, code))
    lines += wrap(
        "The fix: start every rank from the same step. In a real job, that "
        "is the step saved in the checkpoint, read by every rank:"
    )
    lines.append(quoted(bug_number, indent + FIXED))
    return lines


def show_fix(report: dict | None) -> None:
    say("-" * WIDTH)
    say("The fix hangdoc points to")
    lines = the_fix(report) if report is not None else None
    if lines is None:
        verdict = report.get("verdict") if report else "no report"
        say(
            f"hangdoc's answer ({verdict}) is not the bug planted in this demo (rank 3 one step "
            "off, a collective mismatch): the report above says what it saw instead."
        )
        return
    for line in lines:
        print(line, file=sys.stderr)
    print(file=sys.stderr, flush=True)


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


def kept_snapshot() -> Path:
    """Where the demo saves its snapshot when ``ARGS`` has no ``--save``: outside the
    scratch directory, which goes at exit; one file per user, replaced by each run."""
    return Path(tempfile.gettempdir()) / f"hangdoc-demo-snapshot-{os.getuid()}.json.gz"


def report_of(snapshot: Path) -> dict | None:
    """The JSON report of a saved snapshot (``hangdoc analyze --json``), None if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "hangdoc", "analyze", "--json", str(snapshot)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    intro()
    tag = uuid.uuid4().hex
    ready = Path(tempfile.mkdtemp(prefix="hangdoc-demo-"))  # scratch: removed at exit
    try:
        return _demo(argv, tag, ready)
    finally:
        shutil.rmtree(ready, ignore_errors=True)


def _demo(argv: list[str], tag: str, ready: Path) -> int:
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, HANGDOC_READY_DIR=str(ready), OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nproc-per-node",
        str(NPROC),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(TRAIN),
    ]
    print(f"$ {' '.join(cmd)}", file=sys.stderr)
    with open(ready / "job.log", "w") as log:  # the child has its own copy of the descriptor
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
        snapshot = _saves(argv) or str(kept_snapshot())  # the user's --save, or ours
        saved = [] if _saves(argv) else ["--save", snapshot]
        print(f"$ hangdoc diagnose pid:{launcher.pid} {' '.join(argv)}", file=sys.stderr)
        code = subprocess.call([sys.executable, "-m", "hangdoc", "diagnose", f"pid:{launcher.pid}", *argv, *saved])
        if code == 0:
            say(f"The snapshot is kept in {snapshot}: `hangdoc analyze {snapshot}` replays it.")
            show_fix(report_of(Path(snapshot)))  # last: the fix is what the reader came for
        return code
    finally:
        kill_all(launcher, tag)
        left = tagged(tag)
        if left:
            print(f"warning: {len(left)} demo process{'' if len(left) == 1 else 'es'} survived", file=sys.stderr)


def _saves(argv: list[str]) -> str | None:
    """The FILE of a ``--save FILE`` (or ``--save=FILE``) the user passed in ``ARGS``."""
    for i, arg in enumerate(argv):
        if arg == "--save" and i + 1 < len(argv):
            return argv[i + 1]
        if match := re.fullmatch(r"--save=(.+)", arg):
            return match[1]
    return None


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # clean up as for Ctrl-C
    sys.exit(main(sys.argv[1:]))
