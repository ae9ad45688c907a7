"""A real headless Chromium, driven through the DevTools protocol over a pipe (stdlib only): load
a page, collect what its console, its exceptions and the network saw, evaluate expressions in
it and take a screenshot. Chromium comes from Debian (scripts/browser-setup)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.procs import ROOT, require_setup

SETUP = ROOT / "scripts" / "browser-setup"
COMMAND_TIMEOUT_S = 60.0


def chromium() -> str:
    """The browser's path: installed by scripts/browser-setup (skipped here, failed under CI,
    when it cannot be)."""
    found = shutil.which("chromium")
    if found is None:
        require_setup(["bash", str(SETUP)], timeout=900, what="scripts/browser-setup")
        found = shutil.which("chromium")
    assert found is not None, "scripts/browser-setup succeeded, yet there is no chromium"
    return found


class Browser:
    """One headless Chromium; ``--remote-debugging-pipe``: commands on fd 3, replies on fd 4,
    each a JSON message ended by a NUL byte."""

    def __init__(self, width: int = 1100, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="torchjob-chromium-")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def fds() -> None:  # in the child: its ends of the pipes at 3 and 4, inherited
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-dev-shm-usage",
             "--hide-scrollbars",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,  # other fds: CLOEXEC
            stdout=subprocess.DEVNULL, stderr=open(Path(self.profile, "stderr.log"), "wb"))
        os.close(to_child)
        os.close(from_child)
        self._next, self._buffer = 0, b""
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One command (to the page's session once attached); its result, or AssertionError."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def _read(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"chromium did not answer {waiting_for} within "
                                     f"{COMMAND_TIMEOUT_S:g} s (exit code {self.proc.poll()})")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise AssertionError(f"chromium closed its pipe before answering {waiting_for}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def wait_event(self, method: str, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """The first event ``method`` of the page (already seen, or the next to come)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._read(deadline, method))

    def open(self, url: str) -> None:
        """A new page at ``url``, watched (console, exceptions, log, network), loaded."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def problems(self) -> list[str]:
        """The console's errors and warnings, uncaught exceptions and log entries."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                                 "warning",
                                                                                 "assert"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error",
                                                                                 "warning"):
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url')}")
        return out

    def requests(self) -> list[str]:
        """Every URL the page asked for (the network's view)."""
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        """The whole page (beyond the window) as a PNG, written to ``path``."""
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png",
                                          captureBeyondViewport=True)["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.session = ""
                self.send("Browser.close")
                self.proc.wait(timeout=20)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            for fd in (self._in, self._out):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)
