"""Run one submitted notebook in a sandboxed kernel and collect its harvests (grader side).

The notebook's code cells run in a kernel inside a bubblewrap sandbox (see ``sandbox``),
driven by nbclient over Jupyter's ``ipc`` transport. After each exercise's last ``check``
cell the grader adds a harvest cell carrying that exercise's cases (see ``harvest``); only
that cell's JSON between a per-run nonce comes back. A wall-clock limit, an address-space
limit and an output cap bound every notebook; ending the sandbox ends all it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_lib.grading import GRADING_ENV
from course_lib.grading.sandbox import Layout, kernel_argv, write_library
from course_lib.limits import GRADER_MEMORY_MB

KERNEL = "course-grade-sandbox"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
UNAVAILABLE = "GradingUnavailable"


@dataclass(frozen=True)
class Limits:
    """Per-notebook limits: seconds of wall clock, address space, learner output, harvest."""

    timeout: float = 300.0
    memory_mb: int = GRADER_MEMORY_MB
    output_mb: int = 16
    harvest_mb: int = 64
    work_mb: int = 512
    startup: float = 120.0


@dataclass(frozen=True)
class Kernel:
    """How kernels start: the ``bwrap`` binary (None: no sandbox, trusted submissions only)
    and the library copy the sandbox sees."""

    library: Mapping[str, bytes]
    bwrap: str | None


@dataclass(frozen=True)
class Harvest:
    """One exercise's harvest cell: the graded expression and the shipped cases."""

    cell: int
    expression: str
    shipped: str


@dataclass
class Execution:
    """What came back from one notebook: harvest texts by exercise, what went wrong, and
    ``grader_problem`` when the fault is the grader's (the kernel would not even start)."""

    harvests: dict[str, str] = field(default_factory=dict)
    status: str = ""
    problem: str = ""
    first_error: str = ""
    grader_problem: str = ""


def harvest_source(name: str, harvest: Harvest, nonce: str) -> str:
    """The code of the cell the grader adds after exercise ``name``'s last check."""
    return ("from course_lib.grading.harvest import harvest as _course_harvest\n"
            f"_course_harvest({harvest.shipped!r}, lambda: ({harvest.expression}), {nonce!r})"
            f"  # {name}")


def with_harvests(sources: list[str], harvests: Mapping[str, Harvest],
                  nonce: str) -> tuple[Any, dict[int, str]]:
    """A notebook of the code cells ``sources``, each graded check followed by its harvest."""
    cells, harvest_at = [], {}
    for index, source in enumerate(sources):
        cells.append(nbformat.v4.new_code_cell(source))
        for name, harvest in harvests.items():
            if harvest.cell == index:
                harvest_at[len(cells)] = name
                cells.append(nbformat.v4.new_code_cell(harvest_source(name, harvest, nonce)))
    return nbformat.v4.new_notebook(cells=cells), harvest_at


_OUTPUTS = frozenset({"stream", "display_data", "execute_result", "update_display_data",
                      "clear_output", "error", "comm_open", "comm_msg", "comm_close"})
"""Messages that carry a cell's output or widget state: counted against the caps."""


class _LimitedClient(NotebookClient):
    """nbclient that caps every output and widget message by size, and keeps of the learner's
    cells only their errors (nothing else a learner prints is ever stored)."""

    def __init__(self, notebook: Any, harvest_at: Mapping[int, str], limits: Limits,
                 on_over: Any, **kwargs: Any) -> None:
        super().__init__(notebook, **kwargs)
        self.harvest_at, self.limits, self.on_over = harvest_at, limits, on_over
        self.learner_bytes, self.harvest_bytes, self.over = 0, 0, ""

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        kind = msg.get("msg_type")
        if kind not in _OUTPUTS:
            return super().process_message(msg, cell, cell_index)
        harvest = cell_index in self.harvest_at
        size = len(json.dumps(msg.get("content", {}), default=str))
        if harvest:
            self.harvest_bytes += size
            over = self.harvest_bytes > self.limits.harvest_mb << 20
        else:
            self.learner_bytes += size
            over = self.learner_bytes > self.limits.output_mb << 20
        if over and not self.over:
            self.over = "harvest" if harvest else "output"
            self.on_over()
        if self.over or not (harvest or kind == "error"):
            return None
        return super().process_message(msg, cell, cell_index)


def _kernel_env(layout: Layout) -> dict[str, str]:
    """The kernel's whole environment: nothing of the grader's leaks in."""
    work = layout.work
    return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": str(work),
            "TMPDIR": str(work / "tmp"), "PYTHONPATH": str(layout.library),
            "IPYTHONDIR": str(work / ".ipython"), "MPLCONFIGDIR": str(work / ".mpl"),
            "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "TRITON_CACHE_DIR": str(work / ".triton"), "JUPYTER_PLATFORM_DIRS": "1",
            GRADING_ENV: "1"}


def _prepare(root: Path, kernel: Kernel, limits: Limits) -> tuple[Layout, dict[str, str]]:
    """Lay out ``root``: the library copy, the work folder, the run folder, the kernel spec;
    return the layout and the environment the kernel is started with."""
    layout = Layout(root / "lib", root / "work", root / "run")
    write_library(kernel.library, layout.library)
    layout.run.mkdir()
    (layout.work / "tmp").mkdir(parents=True)  # in a sandbox, hidden by its own work folder
    env = _kernel_env(layout)
    argv = kernel_argv(kernel.bwrap, layout, limits.memory_mb, max(limits.output_mb, 64),
                       limits.work_mb, env)
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "sandbox", "language": "python"}))
    return layout, env


async def execute(sources: list[str], harvests: Mapping[str, Harvest], limits: Limits,
                  kernel: Kernel) -> Execution:
    """Run the code cells ``sources`` in a sandboxed kernel; return the harvests."""
    nonce = secrets.token_hex(16)
    runnable, harvest_at = with_harvests(sources, harvests, nonce)
    root = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp" if Path("/tmp").is_dir() else None))
    result = Execution()
    km = None
    try:
        layout, env = _prepare(root, kernel, limits)
        km = AsyncKernelManager(kernel_name=KERNEL, transport="ipc", ip=str(layout.run / "k"),
                                kernel_spec_manager=KernelSpecManager(
                                    kernel_dirs=[str(root / "kernels")]))
        km.connection_file = str(layout.run / "kernel.json")
        await _run(km, runnable, harvest_at, limits, layout, env, result)
    finally:
        if km is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(km.shutdown_kernel(now=True), 10)
        _remove(root)
    _read_harvests(runnable, harvest_at, nonce, result)
    return result


def _remove(root: Path) -> None:
    """Delete a notebook's folders whatever its kernel left there, and never raise: folders
    without the write bit, symlinks (removed, never followed), trees too deep for a
    recursive walk or too long for a path. Each folder found is first moved up to ``root``,
    so every path stays short and the walk needs no recursion."""
    moved, pending = 0, [root]
    while pending:
        folder = pending.pop()
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)
            for entry in list(os.scandir(folder)):
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        moved += 1
                        flattened = root / f".removed-{moved}"
                        os.chmod(entry.path, 0o700)  # moving a folder rewrites its ".."
                        os.rename(entry.path, flattened)
                        pending.append(flattened)
                    else:
                        os.unlink(entry.path)
        if folder != root:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    with contextlib.suppress(OSError):
        os.rmdir(root)


async def _kill(km: AsyncKernelManager) -> None:
    """End the sandbox: killing ``bwrap`` ends every process inside it."""
    with contextlib.suppress(Exception):
        await km.kill_kernel()


async def _run(km: AsyncKernelManager, runnable: Any, harvest_at: Mapping[int, str],
               limits: Limits, layout: Layout, env: dict[str, str], result: Execution) -> None:
    """Start the kernel and run every cell under the limits, noting what went wrong."""
    loop = asyncio.get_running_loop()

    kills: list[asyncio.Task[None]] = []

    def over() -> None:
        kills.append(loop.create_task(_kill(km)))

    client = _LimitedClient(runnable, harvest_at, limits, over, km=km, timeout=limits.timeout,
                            allow_errors=True, kernel_name=KERNEL, record_timing=False,
                            startup_timeout=limits.startup)
    try:
        await km.start_kernel(env=env, cwd=str(layout.work), stdout=subprocess.DEVNULL,
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
            await _kill(km)
            result.status, result.problem = _why(TimeoutError(), limits)
            task.cancel()
        try:
            await asyncio.wait_for(task, 30)
        except (asyncio.CancelledError, TimeoutError):
            pass
        except (CellTimeoutError, DeadKernelError) as error:
            if not result.status:
                result.status, result.problem = _why(error, limits)
        except Exception as error:  # nbclient choked on a message the kernel forged
            await _kill(km)
            if not result.status:
                result.status = "kernel died"
                result.problem = f"the kernel broke Jupyter's protocol ({type(error).__name__})"
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
    """The first error a learner cell raised, for the reason column: not an unsolved stub,
    and not the course's own code refusing while grading (a demo cell after a check)."""
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if index not in harvest_at else []:
            name = output.get("ename")
            if output.get("output_type") != "error" or name in ("NotImplementedError",
                                                                UNAVAILABLE):
                continue
            if name == "MemoryError":
                return f"MemoryError (memory limit {limits.memory_mb} MB)"
            return f"{name}: {output.get('evalue')}"[:200]
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
