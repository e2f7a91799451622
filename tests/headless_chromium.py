"""Headless Chromium for the HTML view's tests: the DOM after the page's scripts ran, a screenshot,
and every network request the page tried (through a proxy that only listens and records).

Chromium sends every http(s) and websocket request to `--proxy-server`, so a page that fetches
anything (a script, a font, an image) shows up in `RequestLog.requests`; file:// pages need none.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import numpy as np

SELFTEST_RESULT = re.compile(r'<pre id="selftest-result"[^>]*>(.*?)</pre>', re.S)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


BROWSER_OWN_HOSTS = ("clients2.google.com", "update.googleapis.com", "accounts.google.com")
"""Where Chromium 156 goes on its own, whatever the page (its clock, component and account checks),
even with the switches below; seen for an empty page too."""

QUIET_SWITCHES = (
    "--no-first-run", "--disable-sync", "--disable-background-networking", "--disable-component-update",
    "--disable-default-apps", "--disable-extensions", "--metrics-recording-only", "--disable-domain-reliability",
    "--disable-client-side-phishing-detection", "--disable-breakpad", "--no-pings",
    "--disable-features=NetworkTimeServiceQuerying,Translate,OptimizationHints,MediaRouter",
)


class RequestLog:
    """A TCP listener standing in for a proxy: it records each connection's first line and closes it."""

    def __init__(self):
        self.requests: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.requests.append(conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1"))
                except OSError:
                    self.requests.append("(connection without a request line)")

    def page_requests(self) -> list[str]:
        """The requests not among Chromium's own (BROWSER_OWN_HOSTS)."""
        return [r for r in self.requests if not any(re.search(rf"[ /]{re.escape(h)}[:/ ]", r) for h in BROWSER_OWN_HOSTS)]

    def close(self) -> None:
        self._server.close()


def run_chromium(url: str, profile: Path, proxy: RequestLog, *args: str, timeout: float = 180) -> str:
    """Chromium's stdout for `url` (e.g. the DOM with --dump-dom); its own background traffic is off."""
    command = [
        chromium_path(), "--headless", "--no-sandbox", "--disable-gpu", *QUIET_SWITCHES, f"--user-data-dir={profile}",
        f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>", *args, url,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def selftest(page: Path, profile: Path, proxy: RequestLog, **params: str) -> tuple[dict, str]:
    """The page's `#selftest` record (view.js: what each view draws, the side panel after a click)
    and the whole DOM it was read from."""
    query = "".join(f"&{k}={v}" for k, v in params.items())
    dom = run_chromium(f"{page.resolve().as_uri()}#selftest{query}", profile, proxy, "--dump-dom")
    match = SELFTEST_RESULT.search(dom)
    assert match, "the page's script did not finish: no selftest record in the DOM"
    text = match.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    return json.loads(text), dom


def screenshot(page: Path, png: Path, profile: Path, proxy: RequestLog, size=(1400, 900)) -> np.ndarray:
    run_chromium(page.resolve().as_uri(), profile, proxy, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}")
    return read_png(png)


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG (what Chromium writes) as a height × width × channels array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG: {header}"
    channels = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * channels)
    return _unfilter(raw, channels).reshape(height, width, channels)


def _unfilter(raw: np.ndarray, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters (none, sub, up, average, Paeth)."""
    height, stride = raw.shape[0], raw.shape[1] - 1
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, row = raw[y, 0], raw[y, 1:]
        if kind == 0:
            line = row.copy()
        elif kind == 1:
            line = np.cumsum(row.reshape(-1, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:
            line = row + previous
        else:
            line = _unfilter_sequential(kind, row, previous, bpp)
        out[y] = line
        previous = line
    return out


def _unfilter_sequential(kind: int, row: np.ndarray, up: np.ndarray, bpp: int) -> np.ndarray:
    line = [0] * len(row)
    row, up = row.tolist(), up.tolist()
    for i in range(len(row)):
        left = line[i - bpp] if i >= bpp else 0
        if kind == 3:
            line[i] = (row[i] + (left + up[i]) // 2) & 0xFF
            continue
        up_left = up[i - bpp] if i >= bpp else 0
        p = left + up[i] - up_left
        pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - up_left)
        predictor = left if pa <= pb and pa <= pc else (up[i] if pb <= pc else up_left)
        line[i] = (row[i] + predictor) & 0xFF
    return np.array(line, dtype=np.uint8)
