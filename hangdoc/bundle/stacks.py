"""``StackTable``: every distinct frame and stack once, numbered in first-seen order."""

from __future__ import annotations

from ..model import Frame


class StackTable:
    """Distinct frames and stacks, each numbered in first-seen order: how a bundle, and an
    agent's answer on the wire, store every stack once and refer to it by number."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.stacks: list[tuple[Frame, ...]] = []
        self._frame_index: dict[Frame, int] = {}
        self._stack_index: dict[tuple[Frame, ...], int] = {}

    def frame_id(self, frame: Frame) -> int:
        idx = self._frame_index.get(frame)
        if idx is None:
            idx = self._frame_index[frame] = len(self.frames)
            self.frames.append(frame)
        return idx

    def stack_id(self, stack: tuple[Frame, ...]) -> int:
        idx = self._stack_index.get(stack)
        if idx is None:
            for frame in stack:
                self.frame_id(frame)
            idx = self._stack_index[stack] = len(self.stacks)
            self.stacks.append(stack)
        return idx
