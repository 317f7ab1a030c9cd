"""A real browser for the tests: Debian's headless Chromium, driven by playwright-core (clients/js/test/browser.mjs).

`scripts/ensure-browser.sh` (run by ./test.sh) installs Chromium and the npm packages. Without them the
browser tests skip, except in CI (`CI` set), where they fail: a CI run must not pass on skipped browser tests.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "clients" / "js"
CHROMIUM = os.environ.get("DAOP_CHROMIUM", "/usr/bin/chromium")


def missing() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"no {CHROMIUM}"
    if shutil.which("node") is None:
        return "no node"
    if not (CLIENT / "node_modules" / "playwright-core").is_dir() or not (CLIENT / "node_modules" / "mqtt").is_dir():
        return f"no npm packages in {CLIENT}"
    return None


class Browser:
    """One page in a fresh Chromium profile; `evaluate` and `wait_for` take JavaScript expressions."""

    def __init__(self, profile: Path, log: Path, extension: Path | None = None) -> None:
        self.log = log
        self._stderr = open(log, "wb")
        extra = [str(extension)] if extension is not None else []
        self.proc = subprocess.Popen(["node", str(CLIENT / "test" / "browser.mjs"), str(profile), *extra], cwd=CLIENT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._id = 0
        hello = self._next(60)
        assert hello.get("ready"), hello

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the browser did not answer within {timeout} s:\n{self.console()}") from None
        if line is None:
            raise AssertionError(f"the browser exited ({self.proc.wait()}):\n{self.console()}")
        return json.loads(line)

    def console(self) -> str:
        self._stderr.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def call(self, op: str, timeout: float = 60.0, **args: Any) -> Any:
        self._id += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._id, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self._next(timeout)
        assert answer["id"] == self._id, answer
        if not answer["ok"]:
            raise AssertionError(f"{op} failed in the browser: {answer['error']}\n{self.console()}")
        return answer["value"]

    def goto(self, url: str, page: int = 0) -> None:
        self.call("goto", url=url, page=page)

    def new_page(self) -> int:
        """Another page (tab) in the same browser; its index for `page=`."""
        return int(self.call("newpage"))

    def evaluate(self, expr: str, timeout: float = 60.0, page: int = 0) -> Any:
        return self.call("eval", timeout=timeout + 5, expr=expr, page=page)

    def wait_for(self, expr: str, timeout: float) -> Any:
        """The first truthy value of `expr`, polled every 20 ms in the page."""
        return self.call("wait", timeout=timeout + 10, expr=expr, timeoutMs=int(timeout * 1000))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def skip_without_browser() -> None:
    why = missing()
    if why:
        message = f"browser tests need Chromium and clients/js's npm packages ({why}): run scripts/ensure-browser.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    skip_without_browser()
    b = Browser(tmp_path / "chromium-profile", tmp_path / "browser.log")
    yield b
    b.close()


@pytest.fixture
def client_site() -> Iterator[str]:
    """clients/js served over HTTP on a free loopback port (the demo is at /demo/); its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(CLIENT)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
