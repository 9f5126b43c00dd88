"""A real headless Chromium (Debian's `chromium`), driven over the Chrome DevTools Protocol.

The protocol is JSON over one websocket (the `websockets` library's sync client): navigate,
evaluate JavaScript in the page, and click with real mouse events at an element's place, so a
click goes through the page's own handlers and fetch() as a person's would. Nothing is fetched
from the network: Chromium runs with its background services off, against loopback only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

FLAGS = [
    "--headless=new",
    "--no-sandbox",  # root in CI: Chromium's sandbox refuses root
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--metrics-recording-only",
    "--no-pings",
    "--disable-domain-reliability",
    "--window-size=1280,900",
    "--remote-debugging-port=0",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One Chromium process with its own profile, and its first page."""

    def __init__(self, exe: str) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="hermes-bulk-chromium-"))
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20)
        self._next_id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params: Any) -> dict:
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + 30
        while True:
            message = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(
                f"in the page: {result['exceptionDetails'].get('exception', {}).get('description')}"
            )
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        time.sleep(0.2)
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not load")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A left click with real mouse events at the middle of the element."""
        x, y = self.evaluate(f"""(() => {{
            const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: "center"}});
            const r = e.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        }})()""")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
