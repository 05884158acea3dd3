"""The rendered report opened in a real headless Chromium, driven over the DevTools protocol.

The page must load without console errors or network fetches, show every figure (decoded, with a
non-zero natural size) and the headline table; a screenshot of the whole page is saved.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
from report_study import REPO, executed

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--window-size=1280,900",
]  # fmt: skip
PAGE_FACTS = """(() => ({
  images: [...document.images].map(i => ({
    src: i.src.slice(0, 22), complete: i.complete, w: i.naturalWidth, h: i.naturalHeight})),
  headlineRows: document.querySelectorAll('table#headline tbody tr').length,
  headlineHead: [...document.querySelectorAll('table#headline thead th')].map(t => t.innerText),
  height: document.documentElement.scrollHeight,
}))()"""


def chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class DevTools:
    """A minimal DevTools-protocol client for one page: commands, and the events seen so far."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = json.loads((await self.ws.receive(timeout=60)).data)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    async def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            msg = await self.ws.receive(timeout=max(deadline - time.monotonic(), 0.1))
            self.events.append(json.loads(msg.data))
        return next(e for e in self.events if e.get("method") == method)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and failed loads."""
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')}")
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif method == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')}")
        return out

    def requested_urls(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]


async def _inspect(port: int, url: str, screenshot: Path) -> tuple[dict, list[str], list[str]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            page = next(t for t in await resp.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            dt = DevTools(ws)
            for domain in ("Page", "Runtime", "Log", "Network"):
                await dt.call(f"{domain}.enable")
            await dt.call("Page.navigate", url=url)
            await dt.wait_for("Page.loadEventFired")
            facts = await dt.call("Runtime.evaluate", expression=PAGE_FACTS, returnByValue=True)
            facts = facts["result"]["value"]
            shot = await dt.call(
                "Page.captureScreenshot", format="png", captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": 1280, "height": min(facts["height"], 16000),
                      "scale": 1},
            )  # fmt: skip
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            return facts, dt.problems(), dt.requested_urls()


def open_in_chromium(html: Path, screenshot: Path) -> tuple[dict, list[str], list[str]]:
    """(page facts, problems, requested URLs) of ``html`` in a fresh headless Chromium."""
    # Chromium's helper processes can still write into the profile after the browser exits: its
    # process group is stopped whole, and a file written after that does not fail the test.
    with tempfile.TemporaryDirectory(
        prefix="chromium-profile-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            port_file, deadline = Path(profile) / "DevToolsActivePort", time.monotonic() + 60
            while not port_file.is_file() or not port_file.read_text().strip():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not start (exit code {proc.poll()})")
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            return asyncio.run(_inspect(port, html.resolve().as_uri(), screenshot))
        finally:
            stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's whole group, then SIGKILL to whatever of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # helpers that outlived the browser
    proc.wait()


pytestmark = [
    pytest.mark.slow,  # the module's fixture renders a whole study
    pytest.mark.skipif(
        chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
    ),
]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    root, done = executed(tmp_path_factory.getbasetemp() / "analysed-study")
    assert done.returncode == 0, f"analysis rules failed:\n{done.stderr[-3000:]}"
    return root / "results" / "report.html"


def test_report_renders_in_chromium(report_html: Path, tmp_path: Path) -> None:
    screenshot = tmp_path / "report.png"
    facts, problems, urls = open_in_chromium(report_html, screenshot)
    assert problems == []
    assert all(u.startswith(("file:", "data:")) for u in urls), f"network fetches: {urls}"
    images = facts["images"]
    assert len(images) >= 8
    for img in images:
        assert img["src"].startswith("data:image/png;base64") and img["complete"], img
        assert img["w"] > 0 and img["h"] > 0, f"figure not decoded: {img}"
    assert facts["headlineRows"] >= 4
    assert "server" in facts["headlineHead"]  # a row per server, a column per context
    assert screenshot.stat().st_size > 10_000
    kept = REPO / "results" / "tests" / "report-screenshot.png"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, kept)


def test_browser_check_catches_a_broken_page(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<html><body><script>console.error('boom')</script>"
        "<img src='data:image/png;base64,AAAA'><img src='missing.png'></body></html>"
    )
    facts, problems, _ = open_in_chromium(page, tmp_path / "broken.png")
    assert any("boom" in p for p in problems)
    assert any("load failed" in p or "missing.png" in p for p in problems)
    assert [img["w"] for img in facts["images"]] == [0, 0]
    assert facts["headlineRows"] == 0
