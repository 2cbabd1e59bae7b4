"""Start one learner kernel under hard limits; run as a script, before any learner code runs.

``python sandbox.py --memory-mb N --file-mb F [--uid U --own PATH ...] -- COMMAND...``

The wrapper marks itself a child subreaper, so every process the kernel starts stays its
descendant even after ``setsid`` and double forks. It runs COMMAND in a child with an
address-space limit (``RLIMIT_AS``), a file-size limit and no core dumps; started as root
with ``--uid``, the child also drops to that unprivileged user (a process-count limit then
applies to it). Where the Linux kernel has Landlock, the child may write files only under
the ``--writable`` folders, so it cannot change the instructor's files, root or not. When
the command ends, or the wrapper is told to stop, every descendant is killed before the
wrapper exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys

import psutil

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
MAX_PROCESSES = 256
_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14
_WRITES = sum(1 << bit for bit in (1, *range(4, 13)))  # write, remove and make-anything


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def landlock_writes(writable: list[str]) -> bool:
    """Forbid this process and its children every file write outside ``writable`` (and
    ``/dev/null``-like devices); reads stay open. False where the kernel lacks Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_LANDLOCK_CREATE, None, 0, 1)
    if abi < 1:
        return False
    handled = _WRITES | (1 << 13 if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        return False
    rules = [(path, handled) for path in writable] + [("/dev", handled & (_WRITE_FILE | _TRUNCATE))]
    for path, access in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = _PathBeneath(access, fd)
        libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)
        os.close(fd)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    done = libc.syscall(_LANDLOCK_RESTRICT, ruleset, 0) == 0
    os.close(ruleset)
    return done


def kill_descendants() -> None:
    """Stop, then kill, every descendant of this process until none is left."""
    for _ in range(20):
        found = psutil.Process().children(recursive=True)
        if not found:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for process in found:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(sig)
        psutil.wait_procs(found, timeout=1)
        _reap()


def _reap() -> None:
    """Collect every exited child so none lingers as a zombie."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _limit_and_drop(memory_mb: int, file_mb: int, uid: int | None, writable: list[str]) -> None:
    """In the child: apply the limits, then become ``uid`` when one is given."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if writable and not landlock_writes(writable) and os.environ.get("COURSE_GRADE_NEED_LANDLOCK"):
        raise SystemExit("sandbox: Landlock is not available")


def _parse(argv: list[str]) -> tuple[int, int, int | None, list[str], list[str], list[str]]:
    """(memory MB, file MB, uid or None, paths to hand to uid, writable folders, command)."""
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    memory_mb = file_mb = 0
    uid: int | None = None
    own: list[str] = []
    writable: list[str] = []
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag == "--memory-mb":
            memory_mb = int(value)
        elif flag == "--file-mb":
            file_mb = int(value)
        elif flag == "--uid":
            uid = int(value)
        elif flag == "--own":
            own.append(value)
        elif flag == "--writable":
            writable.append(value)
        else:
            raise SystemExit(f"sandbox: unknown option {flag!r}")
    if memory_mb <= 0 or file_mb <= 0 or not command:
        raise SystemExit("sandbox: --memory-mb, --file-mb and a command are required")
    return memory_mb, file_mb, uid, own, writable, command


def main(argv: list[str]) -> int:
    """Run the command under the limits; return its exit status."""
    memory_mb, file_mb, uid, own, writable, command = _parse(argv)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for path in own if uid is not None else []:
        os.chown(path, uid, uid)
    child = os.fork()
    if child == 0:
        try:
            _limit_and_drop(memory_mb, file_mb, uid, writable)
            os.execvp(command[0], command)
        finally:
            os._exit(127)

    def stop(signum: int, _frame: object) -> None:
        kill_descendants()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGINT, lambda *_: os.kill(child, signal.SIGINT))
    status = 0
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = os.waitstatus_to_exitcode(wait_status)
            break
    kill_descendants()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
