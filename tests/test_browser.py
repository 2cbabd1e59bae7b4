"""The course as a learner sees it: JupyterLab in a real (headless) Chromium.

Headless notebook runs cannot tell whether a widget renders. Each test starts its own
JupyterLab over a copy of the lectures and opens lecture notebooks in Debian's Chromium
driven by Playwright: either runs one, moves a slider, and checks that what is drawn
changes, or opens every lecture in turn in one page without running it (not trusted, as a
learner first sees it) and counts the pictures it shows against the pictures it stores.

Every test is sealed in its ``tmp_path``: HOME, the Jupyter config/data/runtime dirs,
JupyterLab's settings and workspaces, IPython's profile, the XDG dirs and Chromium's profile
all point there, for this process, the server, its kernels and the browser (TMPDIR is a short
folder of the test's own in the system temp dir, removed afterwards: Chromium's socket paths
must stay under 108 bytes); the
notebook opens in a workspace of its own (``/lab/workspaces/<unique>/tree/...?reset``), so
no test sees another's layout, whatever the order. Each test then checks that its workspace,
server and kernel files landed in the tmp home and that nothing of its own appeared under
the real home. Screenshots are taken in ``tmp_path`` and copied to the repository's
(gitignored) ``test-artifacts/browser/``. Where no browser can be installed (not root, no
apt-get, no network to the package mirror) the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LECTURES = sorted((ROOT / "notebooks").glob("*.ipynb"))
PICTURES = ("image/png", "image/svg+xml")
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--no-default-browser-check", "--password-store=basic",
]
TOKEN = "course-browser-test"
# What JupyterLab, IPython, matplotlib and Chromium would write under a real home.
HOME_DIRS = (".jupyter", ".local/share/jupyter", ".ipython", ".config/chromium",
             ".cache/chromium", ".pki", ".config/matplotlib", ".cache/matplotlib")
START_S = 90  # server start, page load, kernel start: generous for a loaded 2-core machine
RUN_MS = 240_000  # running a whole notebook
UPDATE_MS = 60_000  # a slider move reaching the kernel and back


@dataclass
class Lab:
    """One test's sealed JupyterLab: its tmp home, server, workspace and what it left."""

    tmp: Path
    scratch: Path
    real_home: Path
    workspace: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:12]}")
    server: subprocess.Popen | None = None
    url: str = ""
    kernel_ids: list[str] = field(default_factory=list)
    real_before: dict[str, int] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.tmp / "home"

    @property
    def runtime(self) -> Path:
        return self.home / ".local" / "share" / "jupyter" / "runtime"

    @property
    def workspaces(self) -> Path:
        return self.home / ".jupyter" / "lab" / "workspaces"

    @property
    def settings(self) -> Path:
        return self.home / ".jupyter" / "lab" / "user-settings"

    @property
    def shots(self) -> Path:
        return self.tmp / "screenshots"

    def env(self) -> dict[str, str]:
        """Every directory a Jupyter/IPython/Chromium process would write to, under tmp."""
        home = self.home
        return {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "TMPDIR": str(self.scratch),
            "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "JUPYTERLAB_SETTINGS_DIR": str(self.settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.workspaces),
            "IPYTHONDIR": str(home / ".ipython"),
            "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

    def markers(self) -> list[str]:
        """Names only this test's files carry: workspace, server pid, kernel ids."""
        pid = self.server.pid if self.server else -1
        return [self.workspace, f"jpserver-{pid}.", f"jpserver-{pid}-", *self.kernel_ids]

    def stop(self) -> None:
        """Stop the server and its kernels; a second call does nothing."""
        if self.server is None or self.server.returncode is not None:
            return
        os.killpg(self.server.pid, signal.SIGTERM)
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()


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


def snapshot(home: Path) -> dict[str, int]:
    """Modification time of every file and folder under the home's Jupyter/browser dirs."""
    found: dict[str, int] = {}
    for name in HOME_DIRS:
        top = home / name
        for path in [top, *top.rglob("*")] if top.exists() else []:
            try:
                found[str(path)] = path.lstat().st_mtime_ns
            except FileNotFoundError:  # removed while we looked (another process's kernel)
                continue
    return found


def start_server(lab: Lab) -> None:
    """Start JupyterLab over a copy of the lectures; wait until its runtime file says ready."""
    root = lab.tmp / "root"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    settings = lab.settings / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "news" toast over the screenshots
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    tracker = lab.settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)  # every cell in the page, so every output can be counted
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    with (lab.tmp / "server.log").open("w") as log:
        lab.server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={free_port()}",
             "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}",
             f"--LabApp.workspaces_dir={lab.workspaces}",
             f"--LabApp.user_settings_dir={lab.settings}",
             "--LabApp.expose_app_in_browser=True", "--allow-root",
             "--ServerApp.disable_check_xsrf=True"],
            stdout=subprocess.DEVNULL, stderr=log,
            start_new_session=True, env=dict(os.environ),  # the fixture has sealed os.environ
        )
    info = lab.runtime / f"jpserver-{lab.server.pid}.json"
    deadline = time.monotonic() + START_S
    while not lab.url:
        if lab.server.poll() is not None or time.monotonic() > deadline:
            tail = (lab.tmp / "server.log").read_text()[-2000:]
            pytest.fail(f"JupyterLab did not start within {START_S} s:\n{tail}")
        if info.exists():
            try:  # the port it really bound, and proof it used the tmp runtime dir
                base = json.loads(info.read_text())["url"].rstrip("/")
                with urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5):
                    lab.url = base
            except (OSError, ValueError, KeyError):
                pass
        time.sleep(0.3)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A JupyterLab of this test's own, with HOME and every Jupyter dir inside tmp_path."""
    reason = ensure_chromium()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    sealed = Lab(tmp=tmp_path, scratch=Path(tempfile.mkdtemp(prefix="lab-")),
                 real_home=Path.home())
    sealed.real_before = snapshot(sealed.real_home)
    for name, value in sealed.env().items():
        monkeypatch.setenv(name, value)
    try:
        start_server(sealed)
        yield sealed
    finally:
        sealed.stop()
        shutil.rmtree(sealed.scratch)
        if sealed.shots.exists():
            shutil.copytree(sealed.shots, ARTIFACTS, dirs_exist_ok=True)


def on_doc(body: str) -> str:
    """A page function of `path` whose `body` sees `doc`: the main-area document at `path`."""
    return ("path => { const app = window.jupyterapp; const doc = app && [...app.shell"
            ".widgets('main')].find(w => w.context && w.context.path === path); " + body + " }")


@contextmanager
def notebook_page(lab: Lab, notebook: str, *, run: bool = True) -> Iterator[tuple[object, str]]:
    """Open `notebook` in this test's workspace of a fresh Chromium profile and, if `run`, run
    every cell.

    Yields the page with a CSS selector scoped to the notebook's node (see `wait_opened`).
    """
    from playwright.sync_api import sync_playwright

    path = f"notebooks/{notebook}"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(lab.tmp / "chromium-profile"), executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.goto(f"{lab.url}/lab/workspaces/{lab.workspace}/tree/{path}?reset&token={TOKEN}")
            doc = wait_opened(page, lab, path)
            if run:
                run_all(page, path)
            yield page, doc
        finally:
            context.close()


def wait_opened(page, lab: Lab, path: str) -> str:
    """Wait until the notebook at `path` is the current document, loaded, its kernel idle;
    check the server's config is sealed; return a CSS selector of the notebook's node.

    Waits on that very document, not on whichever widget is current.
    """
    page.wait_for_function(on_doc(
        "const k = doc && doc.sessionContext.session && doc.sessionContext.session.kernel;"
        " return !!doc && doc === app.shell.currentWidget && doc.context.isReady"
        " && !!k && k.status === 'idle';"), arg=path, timeout=START_S * 1000)
    assert_sealed_config(page, lab, lab.workspace)
    widget_id, kernel_id = page.evaluate(
        on_doc("return [doc.id, doc.sessionContext.session.kernel.id];"), path)
    lab.kernel_ids.append(kernel_id)
    return f'[id="{widget_id}"]'


def run_all(page, path: str) -> None:
    """Run every cell of the notebook at `path`; fail unless all of them succeed."""
    page.evaluate(on_doc(
        "window.courseRun = undefined; app.shell.activateById(doc.id);"
        " app.commands.execute('notebook:run-all-cells')"
        "   .then(ok => { window.courseRun = ok; }, err => { window.courseRun = String(err); });"
    ), path)
    page.wait_for_function("() => window.courseRun !== undefined", timeout=RUN_MS)
    assert page.evaluate("() => window.courseRun") is True, "a cell failed when run in the browser"
    page.wait_for_function(on_doc(
        "const k = doc.sessionContext.session.kernel; return !!k && k.status === 'idle';"
    ), arg=path, timeout=RUN_MS)


def assert_sealed_config(page, lab: Lab, workspace: str) -> None:
    """The server the page talks to keeps its settings and workspaces in the tmp home."""
    config = page.evaluate(
        "() => JSON.parse(document.getElementById('jupyter-config-data').textContent)")
    for key in ("workspacesDir", "userSettingsDir"):
        assert Path(config[key]).is_relative_to(lab.home), (key, config[key])
    assert config["workspace"] == workspace


def assert_real_home_untouched(lab: Lab) -> None:
    """This test's files are in the tmp home, and none of them appeared under the real home.

    Other processes on a shared machine (nbval kernels) may write the real runtime and
    IPython dirs meanwhile, so the real home is checked for this test's own names, and for
    any change at all in the dirs only JupyterLab and Chromium use.
    """
    lab.stop()
    assert list(lab.workspaces.glob(f"{lab.workspace}*.jupyterlab-workspace"))
    assert (lab.home / ".ipython" / "profile_default").is_dir()  # the kernel's IPYTHONDIR
    assert (lab.tmp / "chromium-profile" / "Default").is_dir()
    after = snapshot(lab.real_home)
    changed = {p for p, mtime in after.items() if lab.real_before.get(p) != mtime}
    changed |= set(lab.real_before) - set(after)
    private = [str(lab.real_home / name) for name in (".jupyter/lab", ".config/chromium",
                                                       ".cache/chromium", ".pki")]
    ours = sorted(p for p in changed
                  if any(m in p for m in lab.markers()) or p.startswith(tuple(private)))
    assert not ours, f"written under the real home: {ours}"


def stored_pictures(path: Path) -> int:
    """Outputs of a notebook that store a picture (PNG or SVG; one count per output)."""
    cells = nbformat.read(path, as_version=4).cells
    return sum(any(key in output.get("data", {}) for key in PICTURES)
               for cell in cells if cell.cell_type == "code" for output in cell.outputs)


SHOWN_PICTURES = (
    "doc => { const node = document.querySelector(doc);"
    " const images = [...node.querySelectorAll('.jp-OutputArea-output img')]"
    "   .filter(img => img.complete && img.naturalWidth > 0);"
    " const svgs = [...node.querySelectorAll('.jp-RenderedSVG svg')];"
    " return images.length + svgs.length; }"
)
"""Pictures a notebook's outputs show: decoded images and rendered SVG documents."""


def test_lectures_show_their_pictures_without_running(lab: Lab) -> None:
    """Opened, not run and not trusted (no SVG rendered): every stored picture shows.

    One page opens the lectures one after another, as a learner opens them from the file
    browser: the first from its URL, each next with JupyterLab's open command once the one
    before is closed and its kernel shut down (each lecture's own kernel starts, as a
    learner's would; the page and browser start once, not ten times).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    shown: dict[str, tuple[int, int]] = {}
    with notebook_page(lab, LECTURES[0].name, run=False) as (page, _):
        for lecture in LECTURES:
            path, stored = f"notebooks/{lecture.name}", stored_pictures(lecture)
            if lecture != LECTURES[0]:
                page.evaluate("path => { window.jupyterapp.commands.execute("
                              "'docmanager:open', {path, factory: 'Notebook'}); }", path)
            doc = wait_opened(page, lab, path)
            trusted = page.evaluate(on_doc(
                "return doc.content.widgets.filter(c => c.model.type === 'code')"
                ".some(c => c.model.trusted);"), path)
            assert not trusted, f"{lecture.name} opened trusted: the test would prove nothing"
            with suppress(PlaywrightTimeout):  # a shortfall is reported below, with counts
                page.wait_for_function(f"([doc, n]) => ({SHOWN_PICTURES})(doc) >= n",
                                       arg=[doc, stored], timeout=UPDATE_MS)
            shown[lecture.name] = (page.evaluate(SHOWN_PICTURES, doc), stored)
            if stored:  # the first picture, as the learner sees it
                picture = page.locator(f"{doc} .jp-OutputArea-output img").first
                picture.scroll_into_view_if_needed()
                picture.screenshot(path=str(lab.shots / f"unrun-{lecture.stem[:2]}.png"))
            # nothing ran in it: free its kernel and page memory for the next lecture
            page.evaluate(on_doc("return doc.sessionContext.shutdown().then(() => doc.dispose());"),
                          path)
            page.wait_for_function("doc => !document.querySelector(doc)", arg=doc)
    wrong = {name: f"shows {got} of {want}" for name, (got, want) in shown.items() if got != want}
    assert not wrong, wrong
    assert sum(want for _, want in shown.values()) > 0
    assert_real_home_untouched(lab)


def test_block_pool_widget_follows_its_timeline_slider(lab: Lab) -> None:
    with notebook_page(lab, "03_block_tables.ipynb") as (page, doc):
        view = page.locator(f"{doc} #pool-view")
        view.wait_for(timeout=UPDATE_MS)
        view.scroll_into_view_if_needed()
        before = (view.get_attribute("data-step"), view.inner_html())
        readout = page.locator(f"{doc} .pool-slider .widget-readout").first
        label = view.locator("svg > g > text").first  # the frame's own label: "step N"
        assert label.text_content() == f"step {readout.inner_text().strip()}"
        assert page.locator(f"{doc} .pool-hash-chain").count() == 0  # hashes come in 04
        page.screenshot(path=str(lab.shots / "pool-before-page.png"))
        view.screenshot(path=str(lab.shots / "pool-before.png"))
        handle = page.locator(
            f"{doc} .pool-slider .noUi-handle, {doc} .pool-slider .ui-slider-handle").first
        handle.focus()
        page.keyboard.press("Home")
        page.wait_for_function(
            "([doc, s]) => document.querySelector(doc + ' #pool-view')"
            ".getAttribute('data-step') !== s",
            arg=[doc, before[0]], timeout=UPDATE_MS,
        )
        after = (view.get_attribute("data-step"), view.inner_html())
        view.screenshot(path=str(lab.shots / "pool-after.png"))
        assert label.text_content() == f"step {readout.inner_text().strip()}"
    assert after[0] != before[0]
    assert after[1] != before[1]  # the drawn pool changed, not only the step label
    assert before[1].count('class="block') and after[1].count('class="block')
    assert_real_home_untouched(lab)


def test_capacity_calculator_slider_changes_the_numbers(lab: Lab) -> None:
    with notebook_page(lab, "01_kv_cache_arithmetic.ipynb") as (page, doc):
        numbers = page.locator(f"{doc} #capacity-numbers").last
        numbers.wait_for(timeout=UPDATE_MS)
        numbers.scroll_into_view_if_needed()
        before = numbers.get_attribute("data-blocks")
        page.screenshot(path=str(lab.shots / "capacity-before.png"))
        handle = page.locator(
            f"{doc} .capacity-budget .noUi-handle, {doc} .capacity-budget .ui-slider-handle")
        handle.first.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "([doc, b]) => { const all = document.querySelectorAll(doc + ' #capacity-numbers');"
            " return all[all.length - 1].getAttribute('data-blocks') !== b; }",
            arg=[doc, before], timeout=UPDATE_MS,
        )
        page.screenshot(path=str(lab.shots / "capacity-after.png"))
        after = numbers.get_attribute("data-blocks")
    assert int(after) > int(before)
    assert_real_home_untouched(lab)
