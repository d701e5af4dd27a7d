"""The watch's messages carry their level as a value; ``--quiet`` chooses by the level
alone, never by the words (issue 26), and prints what it shows as it always did."""

from __future__ import annotations

import pytest

from hangdoc import cli
from hangdoc.errors import one_line
from hangdoc.watch import watchdog
from hangdoc.watch.config import Level, Say, WatchConfig

SHOWN_WHEN_QUIET = {Level.HANG, Level.ERROR, Level.STOP}
# the same words at every level: whether a line shows may depend on its level only
TEXTS = (
    "HANG collective_mismatch: rank 3",
    "watching pid:1",
    "could not diagnose: x",
    "interrupted: ending the wrapped command",
    "a\nline with \x1b[31mcontrol\x1b[0m characters",
)


def _printed(texts: tuple[str, ...] = TEXTS) -> str:
    return "".join(f"hangdoc watch: {one_line(text)}\n" for text in texts)


@pytest.mark.parametrize("level", list(Level))
def test_quiet_shows_hangs_errors_and_early_stops_and_hides_the_rest_by_level(
    level: Level, capsys: pytest.CaptureFixture[str]
) -> None:
    for text in TEXTS:
        cli._stderr_hang_only(level, text)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (_printed() if level in SHOWN_WHEN_QUIET else "")


@pytest.mark.parametrize("level", list(Level))
def test_without_quiet_every_level_is_shown_as_one_line(level: Level, capsys: pytest.CaptureFixture[str]) -> None:
    for text in TEXTS:
        cli._stderr_watch(level, text)
    assert capsys.readouterr().err == _printed()


@pytest.mark.parametrize("quiet", [False, True])
def test_the_cli_hands_the_watch_a_say_that_filters_by_level(
    quiet: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run_watch(config: WatchConfig, say: Say) -> int:
        for level in Level:
            say(level, f"a message at level {level.value}")
        return 0

    monkeypatch.setattr(watchdog, "run_watch", run_watch)
    assert cli.main(["watch", *(["-q"] if quiet else []), "--", "true"]) == 0
    err = capsys.readouterr().err
    shown = {level for level in Level if f"hangdoc watch: a message at level {level.value}\n" in err}
    assert shown == (SHOWN_WHEN_QUIET if quiet else set(Level))
