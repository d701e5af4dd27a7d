"""A real headless Chromium, driven over the DevTools protocol, for the HTML report's tests.

Debian's ``chromium`` is started with ``--remote-debugging-pipe``: it reads protocol
commands on its fd 3 and writes answers and events on its fd 4, each message one JSON
object ended by a NUL byte. So no websocket client, no port and no browser download are
needed, only the standard library. ``Browser`` opens one page (a target, attached in
"flat" mode: commands carry its ``sessionId``), navigates, evaluates JavaScript, and
keeps the page's console errors, uncaught exceptions and log errors in ``errors``.
``png_pixels`` decodes the screenshots it takes (8-bit RGB/RGBA PNG, as Chromium writes
them) so a test can tell a blank page from a drawn one.

    with Browser() as browser:
        browser.open(Path("report.html").as_uri())
        assert browser.evaluate("document.title") == "..."
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib
from typing import Any, Self

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The browser to start (``HANGDOC_CHROMIUM``, else the first of ``CANDIDATES`` on PATH)."""
    given = os.environ.get("HANGDOC_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """Chromium exited, timed out or answered a command with an error."""


class Browser:
    """One headless Chromium with one page; a context manager that kills it on exit."""

    def __init__(
        self, executable: str | None = None, width: int = 1280, height: int = 900, timeout: float = 30.0
    ) -> None:
        executable = executable or find_chromium()
        if executable is None:
            raise BrowserError("no chromium on PATH (Debian: apt-get install chromium)")
        self.timeout = timeout
        self.errors: list[str] = []  # console errors, uncaught exceptions, log errors
        self.events: list[dict[str, Any]] = []
        self._profile = tempfile.mkdtemp(prefix="hangdoc-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._evt_r, evt_w = os.pipe()
        args = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-component-update",
            "--disable-default-apps",
            "--mute-audio",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # the shell puts the pipes on fds 3 and 4, where --remote-debugging-pipe expects them
        self._proc = subprocess.Popen(
            ["sh", "-c", 'exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null', "sh", *args],
            stdin=cmd_r,
            stdout=evt_w,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(cmd_r)
        os.close(evt_w)
        self._buf = bytearray()
        self._next_id = 0
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
            attached = self.call(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, session=False
            )
            self.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = True, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result", {})
            self._event(answer)

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        """The next event ``method`` (one already received counts)."""
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            event = self._read(deadline)
            if event.get("method") == method:
                self._event(event)
                self.events.remove(event)
                return event
            self._event(event)

    def _read(self, deadline: float) -> dict[str, Any]:
        while (end := self._buf.find(b"\0")) < 0:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._evt_r], [], [], max(left, 0))
            if not ready:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._evt_r, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited (status {self._proc.poll()})")
            self._buf += chunk
        raw = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return json.loads(raw)  # type: ignore[no-any-return]

    def _event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(
                "exception: " + str(details.get("exception", {}).get("description") or details.get("text"))
            )
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + str(params["entry"].get("text")))
        if method is not None:
            self.events.append(event)
            del self.events[:-500]  # keep the recent ones only

    # ------------------------------------------------------------------ page

    def open(
        self, url: str, ready: str | None = "document.body && document.body.dataset.ready", timeout: float | None = None
    ) -> float:
        """Navigate to ``url`` and wait for its load event, then until the JavaScript
        ``ready`` is truthy; returns the seconds from the navigation to that moment."""
        self.events.clear()
        start = time.monotonic()
        result = self.call("Page.navigate", {"url": url}, timeout=timeout)
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired", timeout=timeout)
        if ready is not None:
            deadline = time.monotonic() + (timeout or self.timeout)
            while not self.evaluate(ready):
                if time.monotonic() > deadline:
                    raise BrowserError(f"the page never became ready ({ready})")
                time.sleep(0.01)
        return time.monotonic() - start

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(
                f"{expression!r} threw: {details.get('exception', {}).get('description') or details.get('text')}"
            )
        return result.get("result", {}).get("value")

    def screenshot(self, scale: float = 1.0) -> bytes:
        """A PNG of the page's viewport, its sides ``scale`` times the window's."""
        params: dict[str, Any] = {"format": "png"}
        if scale != 1.0:
            size = self.evaluate("[window.innerWidth, window.innerHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": scale}
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    def set_viewport(self, width: int, height: int) -> None:
        """Lay the page out as in a window of ``width`` x ``height`` CSS pixels (until
        ``reset_viewport``); takes effect at once, also on the page already open."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def reset_viewport(self) -> None:
        """Back to the window's own size."""
        self.call("Emulation.clearDeviceMetricsOverride")

    def full_screenshot(self) -> bytes:
        """A PNG of the whole page, below the fold too, at the viewport's width."""
        width, height = self.evaluate("[document.documentElement.clientWidth, document.documentElement.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        params = {"format": "png", "captureBeyondViewport": True, "clip": clip}
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """Kill the browser and every process it started, and remove its profile."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait(timeout=10)
        for fd in (self._cmd_w, self._evt_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def png_pixels(png: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """``(width, height, pixels)`` of an 8-bit RGB or RGBA, non-interlaced PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, bytearray(), b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        data = png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = data
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        prev = line
    pixels = [tuple(row[x * bpp : x * bpp + 3]) for row in rows for x in range(width)]
    return width, height, pixels
