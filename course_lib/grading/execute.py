"""Run one submitted notebook in a sandboxed kernel and collect its harvests (grader side).

The notebook's code cells run in a kernel inside a bubblewrap sandbox (see ``sandbox``),
driven by nbclient over Jupyter's ``ipc`` transport: the kernel's sockets lie in an
in-memory folder of the sandbox's own, which the grader reaches through ``/proc/PID/root``.
After each exercise's last ``check`` cell the grader adds a harvest cell carrying that
exercise's cases (see ``harvest``); only that cell's JSON between a per-run nonce comes back.
A wall-clock limit, memory limits (a cgroup where the grader may make one) and an output cap
bound every notebook, and ZeroMQ refuses any message over the cap before the grader reads
it; ending the sandbox ends all it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import zmq
import zmq.asyncio
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_lib.grading import GRADING_ENV
from course_lib.grading.sandbox import (
    CONNECTION,
    IPC,
    MAX_TASKS,
    SCRATCH_MB,
    Layout,
    import_paths,
    kernel_argv,
    make_cgroup,
    memory_cgroup,
    remove_cgroup,
    seccomp_program,
    write_library,
)
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
    harvest_mb: int = 16
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

_READ = frozenset({"status", "execute_input", "execute_reply", "kernel_info_reply",
                   "shutdown_reply", "stream", "error"})
"""The only messages whose content the grader parses: the rest are counted, never read."""

MAX_PARSED = 1 << 20
"""Largest content the grader parses but a stream's (a megabyte: at most about 30 MB as
Python objects, however it is nested)."""

def _plain_stream(body: bytes) -> bool:
    """Whether a stream message's content is what ipykernel writes, two strings (so cheap to
    parse): ``{"name": "stdout", "text": "..."}`` with no unescaped quote inside the text."""
    for name in (b"stdout", b"stderr"):
        head = b'{"name": "' + name + b'", "text": "'
        if body.startswith(head) and body.endswith(b'"}'):
            text = body[len(head):-2].replace(b"\\\\", b"").replace(b'\\"', b"")
            return b'"' not in text
    return False


class _GuardedSession(Session):
    """Jupyter's message session, reading a kernel's messages within bounds before any JSON
    is parsed: a header over 64 KB, a stream that is not two strings, or another content
    over :data:`MAX_PARSED` is refused as a broken protocol, and only :data:`_READ`
    contents are parsed."""

    def deserialize(self, msg_list: Any, content: bool = True, copy: bool = True) -> Any:
        parts = [bytes(part.bytes) if isinstance(part, zmq.Frame) else part
                 for part in msg_list]
        if len(parts) < 5 or max(map(len, parts[1:4])) > 1 << 16:
            raise ValueError("a malformed message or an oversized header")
        message = super().deserialize(parts[:5], content=False, copy=True)
        body, kind = parts[4], message["msg_type"]
        message["size"] = sum(map(len, parts))
        if kind not in _READ:
            message["content"] = {}
        elif _plain_stream(body) if kind == "stream" else len(body) <= MAX_PARSED:
            message["content"] = self.unpack(body)
        else:
            raise ValueError(f"a {kind} message the grader will not parse")
        return message


class _LimitedClient(NotebookClient):
    """nbclient that caps every output and widget message by size, and keeps of the learner's
    cells only their errors and of the harvest cells only what they print (nothing else a
    learner prints is ever stored)."""

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
        size = msg.get("size", 0)
        if harvest:
            self.harvest_bytes += size
            over = self.harvest_bytes > self.limits.harvest_mb << 20
        else:
            self.learner_bytes += size
            over = self.learner_bytes > self.limits.output_mb << 20
        if over and not self.over:
            self.over = "harvest" if harvest else "output"
            self.on_over()
        if self.over or kind != ("stream" if harvest else "error"):
            return None
        return super().process_message(msg, cell, cell_index)


def _kernel_env(layout: Layout) -> dict[str, str]:
    """The kernel's whole environment: nothing of the grader's leaks in."""
    work = layout.work
    return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
            "PYTHONPATH": os.pathsep.join([str(layout.library), *import_paths()]),
            "IPYTHONDIR": str(work / ".ipython"), "MPLCONFIGDIR": str(work / ".mpl"),
            "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2",
            "TRITON_CACHE_DIR": str(work / ".triton"), "JUPYTER_PLATFORM_DIRS": "1",
            GRADING_ENV: "1"}


def kernel_command() -> list[str]:
    """How a kernel starts, inside the sandbox or not."""
    return [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def _prepare(root: Path, kernel: Kernel, limits: Limits,
             command: list[str]) -> tuple[Layout, dict[str, str], list[str]]:
    """Lay out ``root``: the library copy, the run folder, the seccomp filter, a cgroup
    where one can be made; return the layout, the kernel's environment and the argv that
    runs ``command`` confined."""
    cgroup = make_cgroup(root.name, limits.memory_mb) if kernel.bwrap else ""
    layout = Layout(root / "lib", root / "work", root / "run", root / "seccomp.bpf", cgroup)
    write_library(kernel.library, layout.library)
    layout.run.mkdir()
    (layout.work / "tmp").mkdir(parents=True)  # in a sandbox, hidden by its own work folder
    layout.seccomp.write_bytes(seccomp_program() if kernel.bwrap else b"")
    env = _kernel_env(layout)
    return layout, env, kernel_argv(kernel.bwrap, layout, limits.memory_mb,
                                    max(limits.output_mb, 64), limits.work_mb, env, command)


def _new_root() -> Path:
    """A notebook's folder, named after this grader's pid (so is its cgroup): short paths
    for Jupyter's sockets, and whatever is left can be told apart from another grader's."""
    return Path(tempfile.mkdtemp(prefix=f"cg-{os.getpid()}-",
                                 dir="/tmp" if Path("/tmp").is_dir() else None))


def preflight(kernel: Kernel, limits: Limits) -> str:
    """Why no kernel can start in this grader's sandbox ("" when one can): first whether the
    interpreter, its packages and the course import there (which names what is missing),
    then a real kernel under the limits."""
    probe = "import ipykernel_launcher, cloudpickle, course_lib.grading.harvest"
    root, cgroup = _new_root(), ""
    try:
        layout, env, argv = _prepare(root, kernel, limits, [sys.executable, "-c", probe])
        cgroup = layout.cgroup
        (layout.run / CONNECTION).write_text("{}")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                              timeout=limits.startup)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        remove_cgroup(cgroup)
        _remove(root)
    if done.returncode:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return asyncio.run(execute([], {}, limits, kernel)).grader_problem


def memory_bound(limits: Limits, kernel: Kernel) -> str:
    """What bounds a notebook's memory in this run, for the summary."""
    if kernel.bwrap is None:
        return f"no sandbox: each process's address space at most {limits.memory_mb} MB"
    if memory_cgroup() is not None:
        return (f"a memory cgroup per notebook: at most {limits.memory_mb} MB in all, "
                "in-memory files and shared memory included")
    files = limits.work_mb + 2 * SCRATCH_MB + 1
    return (f"no cgroup could be made here: at most {MAX_TASKS} processes of "
            f"{limits.memory_mb} MB address space each plus {files} MB of in-memory files; "
            "memfd and System V shared memory denied")


def _message_cap(limits: Limits) -> int:
    """Largest ZeroMQ message the grader accepts: one whole output or harvest cap."""
    return (max(limits.output_mb, limits.harvest_mb) << 20) + (1 << 16)


async def execute(sources: list[str], harvests: Mapping[str, Harvest], limits: Limits,
                  kernel: Kernel) -> Execution:
    """Run the code cells ``sources`` in a sandboxed kernel; return the harvests."""
    nonce = secrets.token_hex(16)
    runnable, harvest_at = with_harvests(sources, harvests, nonce)
    root = _new_root()
    result = Execution()
    km, layout = None, None
    relay = _Relay((limits.output_mb + limits.harvest_mb + 16) << 20) if kernel.bwrap else None
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, _message_cap(limits))
    context.setsockopt(zmq.RCVHWM, 4)
    try:
        layout, env, argv = _prepare(root, kernel, limits, kernel_command())
        spec = root / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps(
            {"argv": argv, "display_name": "sandbox", "language": "python"}))
        km = AsyncKernelManager(kernel_name=KERNEL, transport="ipc", context=context,
                                session=_GuardedSession(),
                                ip=f"{IPC}/k" if kernel.bwrap else str(layout.run / "k"),
                                kernel_spec_manager=KernelSpecManager(
                                    kernel_dirs=[str(root / "kernels")]))
        km.connection_file = str(layout.run / CONNECTION)
        await _run(km, runnable, harvest_at, limits, layout, env, result, relay)
    finally:
        if km is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(km.shutdown_kernel(now=True), 10)
        context.destroy(linger=0)
        if relay is not None:
            relay.close()
        remove_cgroup(layout.cgroup if layout is not None else "")
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


async def _sandbox_ipc(km: AsyncKernelManager, timeout: float) -> str:
    """The kernel's socket prefix as the grader reaches it: the ``ipc`` folder inside the
    sandbox, through ``/proc/PID/root`` of ``bwrap``'s first child (the sandbox's root)."""
    pid = km.provisioner.pid  # type: ignore[union-attr]
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap":
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                if children:
                    return f"/proc/{children[0]}/root{IPC}/k"
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no sandbox appeared within {timeout:g} s")


@dataclass
class _Relay:
    """Every byte a sandboxed kernel sends the grader, relayed through sockets of the grader's
    own and counted: once ``budget`` is spent the relay stops and ``on_over`` hears of it, so
    no message, however many frames it has, brings more into the grader. The kernel's
    sockets are each opened once bound (``O_PATH``, never through a symlink), so no name the
    kernel changes later in its folder can redirect the grader."""

    budget: int
    on_over: Callable[[], None] = lambda: None
    descriptors: list[int] = field(default_factory=list)
    servers: list[asyncio.AbstractServer] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, km: AsyncKernelManager, inside: str, links: Path,
                    timeout: float) -> str:
        """Relay each of the kernel's sockets; return the prefix the grader connects to."""
        links.mkdir()
        deadline = asyncio.get_running_loop().time() + timeout
        for port in (km.shell_port, km.iopub_port, km.stdin_port, km.control_port,
                     km.hb_port):
            while True:
                with contextlib.suppress(FileNotFoundError):
                    self.descriptors.append(os.open(f"{inside}-{port}",
                                                    os.O_PATH | os.O_NOFOLLOW))
                    break
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"the kernel bound no socket within {timeout:g} s")
                await asyncio.sleep(0.02)
            if not stat.S_ISSOCK(os.fstat(self.descriptors[-1]).st_mode):
                raise RuntimeError("the kernel's socket folder holds something else")
            target = f"/proc/self/fd/{self.descriptors[-1]}"
            self.servers.append(await asyncio.start_unix_server(
                lambda reader, writer, target=target: self._connect(target, reader, writer),
                path=str(links / f"k-{port}")))
        return str(links / "k")

    async def _connect(self, target: str, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(OSError):
            kernel_reader, kernel_writer = await asyncio.open_unix_connection(target)
            self.writers.append(kernel_writer)
            await asyncio.wait([asyncio.ensure_future(self._pump(kernel_reader, writer, True)),
                                asyncio.ensure_future(self._pump(reader, kernel_writer, False))],
                               return_when=asyncio.FIRST_COMPLETED)
        self.close_connections()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    counted: bool) -> None:
        with contextlib.suppress(OSError):
            while self.budget > 0 and (data := await reader.read(1 << 16)):
                if counted:
                    self.budget -= len(data)
                    if self.budget <= 0:
                        self.on_over()
                        return
                writer.write(data)
                await writer.drain()

    def close_connections(self) -> None:
        for writer in self.writers:
            writer.close()

    def close(self) -> None:
        """Stop relaying and let go of the kernel's sockets."""
        for server in self.servers:
            server.close()
        self.close_connections()
        for descriptor in self.descriptors:
            os.close(descriptor)


async def _start(km: AsyncKernelManager, client: NotebookClient, limits: Limits,
                 layout: Layout, env: dict[str, str], relay: _Relay | None) -> None:
    """Start the kernel and connect to it (a sandboxed one through ``relay``)."""
    await km.start_kernel(env=env, cwd=str(layout.work), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    if relay is not None:
        inside = await _sandbox_ipc(km, limits.startup)
        km.ip = await relay.serve(km, inside, layout.run.parent / "links", limits.startup)
    client.kc = km.client(context=km.context)  # the context that caps messages
    client.kc.start_channels()
    await client.kc.wait_for_ready(timeout=limits.startup)


async def _watch_sockets(km: AsyncKernelManager, client: _LimitedClient) -> None:
    """Note a kernel that sent a message over the cap (it printed more than the cap at once):
    ZeroMQ drops the connection without reading it (``MAXMSGSIZE``), and the kernel is still
    alive a moment later."""
    monitors = [channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                for channel in (client.kc.iopub_channel, client.kc.shell_channel)]
    try:
        await asyncio.wait([asyncio.ensure_future(m.recv_multipart()) for m in monitors],
                           return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(1)
        if await km.is_alive() and not client.over:
            client.over = "output"
            client.on_over()
    finally:
        for monitor in monitors:
            monitor.close(linger=0)


async def _run(km: AsyncKernelManager, runnable: Any, harvest_at: Mapping[int, str],
               limits: Limits, layout: Layout, env: dict[str, str], result: Execution,
               relay: _Relay | None) -> None:
    """Start the kernel and run every cell under the limits, noting what went wrong."""
    loop = asyncio.get_running_loop()

    kills: list[asyncio.Task[None]] = []
    capped = asyncio.Event()  # an output cap was hit: the kernel is killed, the run is over

    def over() -> None:
        kills.append(loop.create_task(_kill(km)))
        capped.set()

    client = _LimitedClient(runnable, harvest_at, limits, over, km=km, timeout=limits.timeout,
                            allow_errors=True, kernel_name=KERNEL, record_timing=False,
                            startup_timeout=limits.startup)

    def spent() -> None:  # every byte counted, whatever it carries
        if not client.over:
            client.over = "output"
            over()

    if relay is not None:
        relay.on_over = spent
    try:
        await _start(km, client, limits, layout, env, relay)
    except Exception as error:  # no learner code has run yet: the grader's own problem
        result.status, result.problem = "kernel died", f"kernel did not start ({error})"[:300]
        result.grader_problem = result.problem
        return
    task = asyncio.ensure_future(client.async_execute())
    watch = asyncio.ensure_future(_watch_sockets(km, client))
    stop = asyncio.ensure_future(capped.wait())
    try:
        # nbclient would wait out the cell's timeout for a reply the killed kernel never sends
        await asyncio.wait({task, stop}, timeout=limits.timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # the clock or a cap decides, whatever nbclient makes of the kill
            watch.cancel()
            await _kill(km)
            if not capped.is_set():
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
            watch.cancel()
            await _kill(km)
            if not result.status:
                result.status = "kernel died"
                result.problem = f"the kernel broke Jupyter's protocol ({type(error).__name__})"
    finally:
        watch.cancel()
        stop.cancel()
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
