"""The course as a learner sees it: JupyterLab in a real (headless) Chromium.

Headless notebook runs cannot tell whether a widget renders. These tests start JupyterLab
on a free loopback port, open lecture notebooks in Debian's Chromium driven by Playwright,
run them, move a slider, and check that what is drawn changes. Screenshots land in
``test-artifacts/browser/``. JupyterLab is stopped whatever happens. Where no browser can be
installed (not root, no apt-get, no network to the package mirror) the tests are skipped
with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run",
]
TOKEN = "course-browser-test"


def ensure_chromium() -> str | None:
    """Install Debian's chromium if it is missing; return a reason if that is impossible."""
    if CHROMIUM.exists():
        return None
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine to install Debian's chromium"
    if os.geteuid() != 0:
        return "installing chromium with apt-get needs root"
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (install, ["apt-get", "update", "-qq"], install):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
        if done.returncode == 0 and CHROMIUM.exists():
            return None
    return f"apt-get could not install chromium: {done.stderr.strip()[-300:]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JupyterLab server over a copy of the lectures; yields its base URL."""
    reason = ensure_chromium()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "news" toast over the screenshots
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
         "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}",
         "--LabApp.expose_app_in_browser=True", "--allow-root",
         "--ServerApp.disable_check_xsrf=True"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(root / "settings")),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/lab?token={TOKEN}", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start within 60 s")
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser(lab: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_and_run_all(browser, lab: str, notebook: str):
    """Open a notebook in JupyterLab, run every cell, and return the page."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab}/lab/tree/notebooks/{notebook}?token={TOKEN}")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session", timeout=60_000,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    return page


def wait_for_idle(page) -> None:
    """Wait until the kernel has run every queued cell."""
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const k = w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle'"
        " && ![...document.querySelectorAll('.jp-InputArea-prompt')]"
        "      .some(p => p.textContent.includes('*')); }",
        timeout=120_000,
    )


def test_block_pool_widget_follows_its_timeline_slider(browser, lab: str) -> None:
    page = open_and_run_all(browser, lab, "03_block_tables.ipynb")
    try:
        view = page.locator("#pool-view")
        view.wait_for(timeout=120_000)
        wait_for_idle(page)
        view.scroll_into_view_if_needed()
        before = (view.get_attribute("data-step"), page.locator("#pool-view").inner_html())
        page.screenshot(path=str(ARTIFACTS / "pool-before-page.png"))
        view.screenshot(path=str(ARTIFACTS / "pool-before.png"))
        handle = page.locator(".pool-slider .noUi-handle, .pool-slider .ui-slider-handle").first
        handle.focus()
        page.keyboard.press("Home")
        page.wait_for_function(
            "s => document.querySelector('#pool-view').getAttribute('data-step') !== s",
            arg=before[0], timeout=60_000,
        )
        after = (view.get_attribute("data-step"), page.locator("#pool-view").inner_html())
        view.screenshot(path=str(ARTIFACTS / "pool-after.png"))
        assert after[0] != before[0]
        assert after[1] != before[1]  # the drawn pool changed, not only the step label
        blocks_before = before[1].count('class="block')
        blocks_after = after[1].count('class="block')
        assert blocks_before and blocks_after
    finally:
        page.close()


def test_capacity_calculator_slider_changes_the_numbers(browser, lab: str) -> None:
    page = open_and_run_all(browser, lab, "01_kv_cache_arithmetic.ipynb")
    try:
        numbers = page.locator("#capacity-numbers").last
        numbers.wait_for(timeout=120_000)
        wait_for_idle(page)
        numbers.scroll_into_view_if_needed()
        before = numbers.get_attribute("data-blocks")
        page.screenshot(path=str(ARTIFACTS / "capacity-before.png"))
        handle = page.locator(".capacity-budget .noUi-handle, .capacity-budget .ui-slider-handle")
        handle.first.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "b => { const all = document.querySelectorAll('#capacity-numbers');"
            " return all[all.length - 1].getAttribute('data-blocks') !== b; }",
            arg=before, timeout=60_000,
        )
        page.screenshot(path=str(ARTIFACTS / "capacity-after.png"))
        assert int(numbers.get_attribute("data-blocks")) > int(before)
    finally:
        page.close()
