"""Run one submitted notebook in a sandboxed kernel and collect its harvests (grader side).

The notebook runs in a fresh temporary folder holding only its own copy and a private copy
of ``course_lib``, in a kernel started by ``sandbox.py`` (limits, Landlock, an unprivileged
user when the grader is root). After each exercise's last ``check`` cell the grader adds a
harvest cell (see ``harvest``); only that cell's JSON between a per-run nonce comes back.
A wall-clock limit, an output cap and a process-tree kill bound every notebook.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_lib.grading import GRADING_ENV
from course_lib.grading.source import GradedCheck
from course_lib.limits import GRADER_MEMORY_MB

MARK = "COURSE_GRADE_MARK"
"""Environment variable every process of one notebook inherits: the process-tree kill's tag."""

KERNEL = "course-grade-sandbox"
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass(frozen=True)
class Limits:
    """Per-notebook limits: seconds of wall clock, address space, learner output, harvest."""

    timeout: float = 300.0
    memory_mb: int = GRADER_MEMORY_MB
    output_mb: int = 16
    harvest_mb: int = 64
    startup: float = 120.0


@dataclass(frozen=True)
class Sandbox:
    """Where kernels run from: a snapshot of ``course_lib`` taken before any learner code."""

    library: Mapping[str, bytes]
    uid: int | None = None

    @classmethod
    def snapshot(cls, uid: int | None = None) -> Sandbox:
        """Read this ``course_lib`` into memory (no caches)."""
        package = Path(__file__).resolve().parent.parent
        files = {str(p.relative_to(package.parent)): p.read_bytes()
                 for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}
        return cls(files, uid)

    def digest(self) -> str:
        """A hash of the snapshot, to compare a notebook's copy against afterwards."""
        return _digest(self.library.items())


@dataclass
class Execution:
    """What came back from one notebook: harvest texts by exercise, what went wrong, and
    ``grader_problem`` when the fault is the grader's (the kernel would not even start)."""

    harvests: dict[str, str] = field(default_factory=dict)
    status: str = ""
    problem: str = ""
    first_error: str = ""
    grader_problem: str = ""


def _digest(items: Any) -> str:
    sha = hashlib.sha256()
    for name, data in sorted(items):
        sha.update(name.encode() + b"\0" + data + b"\0")
    return sha.hexdigest()


def _library_digest(lib: Path) -> str:
    return _digest((str(p.relative_to(lib)), p.read_bytes())
                   for p in lib.rglob("*.py") if "__pycache__" not in p.parts)


def harvest_source(name: str, check: GradedCheck, nonce: str) -> str:
    """The code of the cell the grader adds after exercise ``name``'s last check."""
    return ("from course_lib.grading.harvest import harvest as _course_harvest\n"
            f"_course_harvest({name!r}, lambda: ({check.expression}), {nonce!r})")


def with_harvests(notebook: Any, checks: Mapping[str, GradedCheck],
                  nonce: str) -> tuple[Any, dict[int, str]]:
    """The notebook's code cells, outputs cleared, each graded check followed by its harvest."""
    cells, harvest_at = [], {}
    for index, cell in enumerate(notebook.cells):
        if cell.get("cell_type") != "code":
            continue
        cells.append(nbformat.v4.new_code_cell(str(cell.get("source", ""))))
        for name, check in checks.items():
            if check.cell == index:
                harvest_at[len(cells)] = name
                cells.append(nbformat.v4.new_code_cell(harvest_source(name, check, nonce)))
    return nbformat.v4.new_notebook(cells=cells), harvest_at


def kill_tree(pid: int | None, mark: str, uid: int | None) -> None:
    """End ``pid`` (the sandbox wrapper) with its descendants, every process tagged ``mark``
    and every process of ``uid``, until none is left.

    The wrapper is asked first: it kills and reaps everything below it, setsid'd orphans
    included. Then whatever is left is stopped (so nothing forks away) and killed.
    """
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            wrapper = psutil.Process(pid)
            wrapper.terminate()
            psutil.wait_procs([wrapper], timeout=3)
    for _ in range(20):
        live = [p for p in _tagged(pid, mark, uid) if _alive(p)]
        if not live:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for proc in live:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(sig)
        deadline = time.monotonic() + 2
        while any(map(_alive, live)) and time.monotonic() < deadline:
            time.sleep(0.02)  # a killed orphan may stay a zombie: dead is enough


def _tagged(pid: int | None, mark: str, uid: int | None) -> list[psutil.Process]:
    """``pid`` and its descendants, and every other process tagged ``mark`` or run as ``uid``."""
    me, found = os.getpid(), {}
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
    for proc in psutil.process_iter(["uids", "status"]):
        if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if uid is not None and proc.info["uids"] and proc.info["uids"].real == uid:
            found[proc.pid] = proc
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARK) == mark:
                found[proc.pid] = proc
    return list(found.values())


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


class _LimitedClient(NotebookClient):
    """nbclient that keeps only errors of learner cells and caps all output by size."""

    def __init__(self, notebook: Any, harvest_at: Mapping[int, str], limits: Limits,
                 on_over: Any, **kwargs: Any) -> None:
        super().__init__(notebook, **kwargs)
        self.harvest_at, self.limits, self.on_over = harvest_at, limits, on_over
        self.learner_bytes, self.harvest_bytes, self.over = 0, 0, ""

    def output(self, outs: list[Any], msg: dict[str, Any], display_id: str | None,
               cell_index: int) -> Any:
        size = len(json.dumps(msg.get("content", {}), default=str))
        if cell_index in self.harvest_at:
            self.harvest_bytes += size
            over = self.harvest_bytes > self.limits.harvest_mb << 20
        else:
            self.learner_bytes += size
            over = self.learner_bytes > self.limits.output_mb << 20
        if over and not self.over:
            self.over = "harvest" if cell_index in self.harvest_at else "output"
            self.on_over()
        if over or (cell_index not in self.harvest_at and msg["msg_type"] != "error"):
            return None
        return super().output(outs, msg, display_id, cell_index)


def _prepare(root: Path, sandbox: Sandbox, name: str, notebook: Any,
             limits: Limits, mark: str) -> tuple[Path, dict[str, str]]:
    """Lay out ``root``: lib/ (course_lib), work/ (the notebook), the kernel spec; the env."""
    lib, work = root / "lib", root / "work"
    for relative, data in sandbox.library.items():
        (lib / relative).parent.mkdir(parents=True, exist_ok=True)
        (lib / relative).write_bytes(data)
    (work / "tmp").mkdir(parents=True)
    nbformat.write(notebook, work / name)
    sandbox_script = lib / "course_lib" / "grading" / "sandbox.py"
    argv = [sys.executable, "-I", str(sandbox_script), "--memory-mb", str(limits.memory_mb),
            "--file-mb", str(max(limits.output_mb, 64)), "--writable", str(work)]
    if sandbox.uid is not None:
        os.chmod(root, 0o755)
        for path in [work, *work.rglob("*")]:
            os.chown(path, sandbox.uid, sandbox.uid)
        argv += ["--uid", str(sandbox.uid), "--own", "{connection_file}"]
    argv += ["--", sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "sandbox", "language": "python"}))
    env = {key: os.environ[key] for key in _KEEP_ENV if key in os.environ}
    env |= {"HOME": str(work), "TMPDIR": str(work / "tmp"), "PYTHONPATH": str(lib),
            "IPYTHONDIR": str(work / ".ipython"), "MPLCONFIGDIR": str(work / ".mpl"),
            "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "TRITON_CACHE_DIR": str(work / ".triton"), GRADING_ENV: "1", MARK: mark}
    return work, env


async def execute(name: str, notebook: Any, checks: Mapping[str, GradedCheck],
                  limits: Limits, sandbox: Sandbox) -> Execution:
    """Run ``notebook`` (saved as ``name``) in a sandboxed kernel; return its harvests."""
    mark, nonce = secrets.token_hex(16), secrets.token_hex(16)
    runnable, harvest_at = with_harvests(notebook, checks, nonce)
    root = Path(tempfile.mkdtemp(prefix="course-grade-"))
    result = Execution()
    km, tampered = None, False
    try:
        work, env = _prepare(root, sandbox, name, runnable, limits, mark)
        km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(
            kernel_dirs=[str(root / "kernels")]))
        km.connection_file = str(root / "connection.json")
        await _run(km, runnable, harvest_at, limits, work, env, mark, sandbox, result)
    finally:
        pid = km.provisioner.pid if km is not None and km.provisioner else None
        kill_tree(pid, mark, sandbox.uid)
        if km is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(km.shutdown_kernel(now=True), 10)
        tampered = (root / "lib").exists() and _library_digest(root / "lib") != sandbox.digest()
        shutil.rmtree(root, ignore_errors=True)
    if tampered:
        result.status, result.problem = "tampered", "changed its copy of course_lib"
    else:
        _read_harvests(runnable, harvest_at, nonce, result)
    return result


async def _run(km: AsyncKernelManager, runnable: Any, harvest_at: Mapping[int, str],
               limits: Limits, work: Path, env: dict[str, str], mark: str,
               sandbox: Sandbox, result: Execution) -> None:
    """Start the kernel and run every cell under the limits, noting what went wrong."""

    def over() -> None:
        kill_tree(km.provisioner.pid if km.provisioner else None, mark, sandbox.uid)

    client = _LimitedClient(runnable, harvest_at, limits, over, km=km, timeout=limits.timeout,
                            allow_errors=True, kernel_name=KERNEL, record_timing=False,
                            startup_timeout=limits.startup)
    try:
        await km.start_kernel(env=env, cwd=str(work), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        client.kc = km.client()
        client.kc.start_channels()
        await client.kc.wait_for_ready(timeout=limits.startup)
    except Exception as error:  # no learner code has run yet: the grader's own problem
        result.status, result.problem = "kernel died", f"kernel did not start ({error})"[:300]
        result.grader_problem = result.problem
        return
    task = asyncio.ensure_future(client.async_execute())
    try:
        await asyncio.wait({task}, timeout=limits.timeout)
        if not task.done():  # the clock decides, whatever nbclient makes of the kill
            over()
            result.status, result.problem = _why(TimeoutError(), limits)
            task.cancel()
        try:
            await asyncio.wait_for(task, 30)
        except (asyncio.CancelledError, TimeoutError):
            pass
        except (CellTimeoutError, DeadKernelError) as error:
            if not result.status:
                result.status, result.problem = _why(error, limits)
    finally:
        client.kc.stop_channels()
    if client.over:
        result.status = "output limit"
        result.problem = (f"printed more than {limits.output_mb} MB" if client.over == "output"
                          else f"harvest over {limits.harvest_mb} MB")
    result.first_error = _first_error(runnable, harvest_at, limits)


def _why(error: BaseException, limits: Limits) -> tuple[str, str]:
    """(status, reason) for how a notebook's execution ended early."""
    if isinstance(error, CellTimeoutError | TimeoutError):
        return "timed out", f"timed out after {limits.timeout:g} s"
    return "kernel died", f"kernel died (memory limit {limits.memory_mb} MB, a crash or a kill)"


def _first_error(notebook: Any, harvest_at: Mapping[int, str], limits: Limits) -> str:
    """The first error a learner cell raised (not an unsolved stub), for the reason column."""
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if index not in harvest_at else []:
            if output.get("output_type") == "error" and output.get(
                    "ename") != "NotImplementedError":
                if output.get("ename") == "MemoryError":
                    return f"MemoryError (memory limit {limits.memory_mb} MB)"
                return f"{output.get('ename')}: {output.get('evalue')}"[:200]
    return ""


def _read_harvests(notebook: Any, harvest_at: Mapping[int, str], nonce: str,
                   result: Execution) -> None:
    """Each harvest cell's text between the nonces, where it holds exactly one."""
    for index, name in harvest_at.items():
        text = "".join(o.get("text", "") for o in notebook.cells[index].get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        parts = text.split(nonce)
        if len(parts) == 3:
            result.harvests[name] = parts[1]
