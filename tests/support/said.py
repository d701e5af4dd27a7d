"""A watch's ``say`` for tests: it keeps every message with its level."""

from __future__ import annotations

from hangdoc.watch.config import Level


class Said(list[tuple[Level, str]]):
    """``Said()`` is a ``Say``: each call appends ``(level, text)``."""

    def __call__(self, level: Level, text: str) -> None:
        self.append((level, text))

    @property
    def texts(self) -> list[str]:
        return [text for _level, text in self]


def silent(_level: Level, _text: str) -> None:
    """A ``Say`` that drops every message."""
