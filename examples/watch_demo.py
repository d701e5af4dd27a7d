"""``make watch-demo``: the demo job under ``hangdoc watch --on-hang kill``, from its start to
the watch's own summary.

Says first that the job is broken on purpose (``run_demo.intro``), then runs
``hangdoc watch --stall-after 5 --on-hang kill --kill-grace 5 --out OUT -- torchrun ...
examples/demo_train.py`` and passes its output through as it comes: the job's lines and the
watch's (``hangdoc watch: ...``). Once the watch says it is ending the job, the launcher's
lines are kept in ``OUT/watch-demo-torchrun.log`` instead of the terminal: torchrun answers
the SIGTERM that ends it with a Python traceback of its own (its ``SignalException``, about
25 lines), which says only that it was asked to stop. Nothing else is held back, and the
summary says where those lines are. Then the fix the report points to
(``run_demo.show_fix``, from the hang directory's ``report.json``), and a summary line.

Exit status 0 when the watch ended the job as documented (124); otherwise the watch's own.
Whatever happens, the job's processes are ended (found by an environment tag).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from run_demo import HERE, TRAIN, free_port, intro, kill_all, say, show_fix, tagged

EXIT_HANG_KILLED = 124  # hangdoc watch: --on-hang kill ended the job
WATCH_PREFIX = "hangdoc watch: "
ENDING = "--on-hang kill: ending the job"
LOG_NAME = "watch-demo-torchrun.log"


def command(out: Path, port: int) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    return [
        sys.executable,
        "-m",
        "hangdoc",
        "watch",
        "--stall-after",
        "5",
        "--on-hang",
        "kill",
        "--kill-grace",
        "5",
        "--out",
        str(out),
        "--",
        str(torchrun),
        "--nproc-per-node",
        "4",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(TRAIN),
    ]


def shown_command(cmd: list[str]) -> str:
    """``cmd`` as a user would type it: ``hangdoc watch ... -- torchrun ... examples/...``."""
    words = ["hangdoc", *cmd[3:]]
    return " ".join(
        "torchrun" if Path(w).name == "torchrun" else str(Path(w).relative_to(HERE.parent)) if w == str(TRAIN) else w
        for w in words
    )


def split(lines: Iterable[str]) -> Iterator[tuple[bool, str]]:
    """``(shown, line)`` for each line of the watch's output: every line is shown until
    the watch says it is ending the job; after that, only the watch's own."""
    ending = False
    for line in lines:
        ours = line.startswith(WATCH_PREFIX)
        ending |= ours and ENDING in line
        yield (ours or not ending), line


def report_dir(line: str) -> Path | None:
    """The hang directory named in the watch's ``report: DIR/report.txt ...`` line."""
    found = re.match(rf"{WATCH_PREFIX}report: (.+)/report\.txt ", line)
    return Path(found[1]) if found else None


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("hangs")
    intro()
    say(
        "Here hangdoc watch wraps torchrun and reads the job's output. When nothing comes for "
        "5 s it diagnoses the job, and a hang it confirms ends the job (--on-hang kill)."
    )
    say()
    tag = uuid.uuid4().hex
    cmd = command(out, free_port())
    print(f"$ {shown_command(cmd)}", file=sys.stderr, flush=True)
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    watch = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    held: list[str] = []
    hang: Path | None = None
    try:
        assert watch.stdout is not None
        text = (raw.decode(errors="replace") for raw in watch.stdout)
        for shown, line in split(text):
            hang = hang or report_dir(line)
            if shown:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                held.append(line)
        status = watch.wait()
    finally:
        kill_all(watch, tag)
        left = tagged(tag)
        if left:
            print(f"warning: {len(left)} demo {'process' if len(left) == 1 else 'processes'} survived", file=sys.stderr)
    elapsed = time.monotonic() - started
    if held:
        out.mkdir(parents=True, exist_ok=True)
        (out / LOG_NAME).write_text("".join(held))
    if status != EXIT_HANG_KILLED:
        say(
            f"watch-demo: hangdoc watch exited with status {status} after {elapsed:.0f} s, not "
            f"{EXIT_HANG_KILLED} (a hang reported and the job ended)"
        )
        return status or 1
    show_fix(_read_json(hang / "report.json") if hang else None)
    kept = (
        (f" torchrun's {len(held)} lines after the kill (its traceback on SIGTERM) are in {out / LOG_NAME}.")
        if held
        else ""
    )
    say(
        f"watch-demo: hang reported in {hang or out}/ (report.txt, report.json, snapshot.json.gz), "
        f"job ended after {elapsed:.0f} s: exit {EXIT_HANG_KILLED}, as documented.{kept}"
    )
    return 0


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
