"""``StackTable``: every distinct frame and stack once, numbered in first-seen order."""

from __future__ import annotations

from ..model import Frame, Stack


class StackTable:
    """Distinct frames and stacks, each numbered in first-seen order: how a bundle, an
    agent's answer on the wire and the HTML report store every stack once and refer to it
    by number.

    A stack is looked up by identity first: the ranks of a capture or a bundle share their
    stacks' tuples, and hashing a 60-frame stack hashes each of its frames (seconds for 2
    million threads). Each stack seen is kept, so no id is reused meanwhile."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.stacks: list[Stack] = []
        self._frame_index: dict[Frame, int] = {}
        self._stack_index: dict[Stack, int] = {}
        self._stack_ids: dict[int, tuple[Stack, int]] = {}

    def frame_id(self, frame: Frame) -> int:
        idx = self._frame_index.get(frame)
        if idx is None:
            idx = self._frame_index[frame] = len(self.frames)
            self.frames.append(frame)
        return idx

    def stack_id(self, stack: Stack) -> int:
        hit = self._stack_ids.get(id(stack))
        if hit is None:
            idx = self._stack_index.get(stack)
            if idx is None:
                for frame in stack:
                    self.frame_id(frame)
                idx = self._stack_index[stack] = len(self.stacks)
                self.stacks.append(stack)
            hit = self._stack_ids[id(stack)] = (stack, idx)
        return hit[1]
