"""Reading captured stacks in tests: the main thread, its innermost Python frame."""

from __future__ import annotations

from hangdoc.model import Frame, ThreadStack

C10D = "torch/distributed/distributed_c10d.py"


def main_thread(threads: tuple[ThreadStack, ...]) -> ThreadStack:
    (main,) = [t for t in threads if t.is_main]
    return main


def innermost_python(thread: ThreadStack) -> Frame:
    return [f for f in thread.frames if not f.native][-1]
