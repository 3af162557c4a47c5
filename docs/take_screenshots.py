"""Retake the TensorBoard screenshots under docs/images, in headless Chromium at TensorBoard's default size.

The pictures in the README and in docs/reading-tensorboard.md are of real runs, in one logdir, as a user sees
them: no "Show actual image size", no zoom, TensorBoard's own layout (Time Series shows a 320 x 215 picture at
1.0x, the Images dashboard 350 px wide). This script serves LOGDIR with TensorBoard (or uses ``--url``), opens
each view in headless Chromium driven by chromedriver (Selenium): a viewport 1280 px wide, 800 px high except
where a view has more cards than fit (a taller window changes nothing in how big a card is drawn). It shoots a
view once two screenshots 2 s apart are the same (TensorBoard draws its charts in a worker and fetches images one
by one: Chromium's own ``--screenshot`` caught half-drawn charts), uncropped, and stores it as a palette PNG of at
most 256 colours (small files: the repository stays lean). Every screenshot must still be looked at by a person
before it is committed.

The runs (short, at the examples' IG defaults; the same commands are in docs/reading-tensorboard.md)::

    export PYTHONPATH=$PWD
    python examples/dqn_cartpole.py --total-timesteps 6000 --runs-dir /tmp/shots/runs
    python examples/dqn_minatar.py --total-timesteps 90000 --seed 1 --accelerator cpu --runs-dir /tmp/shots/runs
    python examples/dqn_minatar.py --total-timesteps 90000 --seed 3 --ig-target each --exp-name dqn_minatar_each \\
        --accelerator cpu --runs-dir /tmp/shots/runs

Then::

    python docs/take_screenshots.py /tmp/shots/runs                 # all of them, into docs/images
    python docs/take_screenshots.py /tmp/shots/runs --only timeseries-minatar --out /tmp/look

Needs Debian's chromium and chromedriver (``apt-get install -y chromium chromium-driver``; ``--chromium``,
``--chromedriver`` or ``$CHROMIUM`` for others), Selenium (``pip install selenium``; not a dependency of the
package), tensorboard and Pillow. The views pick runs by the names the examples give them (``cartpole``,
``minatar__1``, ``minatar_each``): runs named otherwise need the ``SHOTS`` table below edited.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from PIL import Image


@dataclass(frozen=True)
class Shot:
    """One screenshot: the view's address after the server's root, the window's size, the part kept."""

    name: str
    view: str  # Time Series reads query parameters ("?tagFilter=...#timeseries"); the older dashboards the hash
    window: tuple[int, int] = (1280, 800)


def time_series(tags: str, runs: str = "", smoothing: float | None = None) -> str:
    """The Time Series view filtered to the tags (and runs) matching these regular expressions."""
    query = f"?tagFilter={quote(tags, safe='')}"
    query += f"&runFilter={quote(runs, safe='')}" if runs else ""
    query += "" if smoothing is None else f"&smoothing={smoothing}"
    return query + "#timeseries"


# Uncropped at 1280 x 800, TensorBoard's default layout (its settings pane open at the right), as a user sees it.
SHOTS = (
    # the first page a user sees with the documented filter: each run's verdict, shares and saliency first
    Shot("timeseries-ig-landing", time_series("ig/")),
    # one MinAtar run's cards (a taller window: all its pictures)
    Shot("timeseries-minatar", time_series("ig/[0-9]_", runs="minatar__1"), window=(1280, 1000)),
    Shot("timeseries-cartpole", time_series("ig/[0-9]_", runs="cartpole")),
    # target="each": the verdict and "What favours each action"
    Shot("timeseries-actions", time_series("ig/(0_|3_)", runs="minatar_each")),
    # the Images dashboard draws each picture 350 px wide, every run's card of a tag side by side
    Shot("images-tab", "#images&tagFilter=" + quote("ig/2_saliency$", safe=""), window=(1280, 800)),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_runs(url: str, logdir: Path, timeout: float = 180.0) -> None:
    """Until the server lists every run folder of ``logdir`` and has read the callback's scalars."""
    expected = {path.name for path in logdir.iterdir() if path.is_dir()}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10) as response:
                tags = json.load(response)
            if expected <= set(tags) and all(any(t.startswith("ig/") for t in tags[run]) for run in expected):
                return
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"TensorBoard at {url} did not list the runs of {logdir} within {timeout:.0f} s")


def open_browser(chromium: str, chromedriver: str) -> Any:
    """Headless Chromium driven by chromedriver (Selenium): a page is shot once it has stopped changing."""
    from selenium import webdriver  # noqa: PLC0415 - only this script needs it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument("--force-device-scale-factor=1")  # css pixels are screen pixels: TensorBoard's own size
    return webdriver.Chrome(service=Service(chromedriver), options=options)


def settled(browser: Any, timeout: float = 60.0, pause: float = 2.0) -> bytes:
    """The page's screenshot once two taken ``pause`` seconds apart are the same (charts are drawn by a worker,
    images fetched one by one: a fixed wait either wastes time or shoots half-drawn charts)."""
    time.sleep(pause)
    previous = browser.get_screenshot_as_png()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(pause)
        current = browser.get_screenshot_as_png()
        if current == previous:
            return current
        previous = current
    return previous


def screenshot(browser: Any, url: str, shot: Shot, output: Path) -> None:
    """Take ``shot`` into ``output``: the window, as a palette PNG."""
    browser.get("about:blank")  # a fresh page each time: Time Series keeps state between views of one page
    browser.set_window_size(*shot.window)  # the outer window: grown by what the browser's frame takes
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    browser.set_window_size(2 * shot.window[0] - inner[0], 2 * shot.window[1] - inner[1])
    browser.get(url + "/" + shot.view)
    image = Image.open(io.BytesIO(settled(browser))).convert("RGB")
    # a UI screenshot has few colours besides anti-aliasing: 256 keep the text crisp at a third of the bytes
    image.quantize(256, method=Image.Quantize.MEDIANCUT).save(output, optimize=True)
    print(f"{output}  {image.width}x{image.height}  {output.stat().st_size // 1024} KB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", type=Path, help="the folder of the runs")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "images", help="where the PNGs go")
    parser.add_argument("--only", nargs="*", help="these screenshots only (names without .png)")
    parser.add_argument("--url", help="a TensorBoard already serving LOGDIR (default: start one on a free port)")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", shutil.which("chromium") or "chromium"))
    parser.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    args = parser.parse_args(argv)
    shots = [shot for shot in SHOTS if not args.only or shot.name in args.only]
    if not shots:
        parser.error(f"--only names none of {', '.join(shot.name for shot in SHOTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(args.logdir), "--port", str(port)]
        server = subprocess.Popen(
            [*command, "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    browser = None
    try:
        wait_for_runs(url.rstrip("/"), args.logdir)
        browser = open_browser(args.chromium, args.chromedriver)
        for shot in shots:
            screenshot(browser, url.rstrip("/"), shot, args.out / f"{shot.name}.png")
    finally:
        if browser is not None:
            browser.quit()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
