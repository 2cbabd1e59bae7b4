"""Run between the grader and ``bwrap``: what a sandbox gets before bubblewrap builds it.

Started as ``python -S confine.py MEMORY FILE TASKS CGROUP SECCOMP CONNECTION -- COMMAND``
(standard library only, no site packages). In this order it sets the resource limits every
process in the sandbox inherits (address space, file size, no core files, a task count),
moves itself into the sandbox's cgroup when the grader made one, starts a fresh, empty
session keyring (so no key of the instructor's session is reachable), and, when ``SECCOMP``
names a compiled filter, opens it for ``bwrap --seccomp``. Run as root it then drops to an
unprivileged host user of its own (:func:`drop_root`), so nothing in the sandbox is host
uid 0. Finally it executes ``COMMAND``: ``bwrap``, or the kernel itself without a sandbox.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import sys

SECCOMP_FD = 3
"""The descriptor ``bwrap --seccomp`` reads the compiled filter from."""

USERNS_FD = 4
"""The descriptor ``bwrap --userns`` joins when the grader runs as root."""

FIRST_HOST_ID = 1 << 30
"""Host uids (and gids) from here on are the sandboxes' own when grading as root: one per
sandbox, the confining process's pid added, far above any account's."""

_KEYCTL = {"x86_64": 250, "aarch64": 219}
_JOIN_SESSION_KEYRING = 1
_CLONE_NEWUSER = 0x10000000


def _keep_at(number: int, descriptor: int) -> None:
    """Make open ``descriptor`` the inheritable descriptor ``number`` (``bwrap`` reads it)."""
    if descriptor != number:
        os.dup2(descriptor, number)
        os.close(descriptor)
    os.set_inheritable(number, True)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def fresh_session_keyring() -> None:
    """Join a new anonymous session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``)."""
    number = _KEYCTL.get(platform.machine())
    if number is None or _libc().syscall(number, _JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "could not start a fresh session keyring")


def join_cgroup(folder: str) -> None:
    """Move this process (and so all it starts) into the cgroup ``folder``."""
    with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))


def _user_namespace(host_id: int) -> int:
    """A user namespace owned by ``host_id`` in which host root is uid 0 (so ``bwrap`` can
    bind what root can read) and ``host_id`` is itself; returns a descriptor of it."""
    ready, go = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:  # the namespace's owner: made as host_id, then kept until it is opened
        os.setgroups([])
        os.setresgid(host_id, host_id, host_id)
        os.setresuid(host_id, host_id, host_id)
        status = 0 if _libc().unshare(_CLONE_NEWUSER) == 0 else 1
        os.write(ready[1], b"x")
        os.read(go[0], 1)
        os._exit(status)
    os.read(ready[0], 1)
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as mapping:
                mapping.write(f"0 0 1\n{host_id} {host_id} 1\n")
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY)
    finally:
        os.write(go[1], b"x")
        os.waitpid(child, 0)


def drop_root(bwrap_argv: list[str], connection: str) -> list[str]:
    """As root: hand the kernel's connection file to a host user of this sandbox's own, join
    ``bwrap`` to a user namespace owned by it, become it; return ``bwrap``'s argv with the
    namespace and that user's ids added."""
    host_id = FIRST_HOST_ID + os.getpid()
    _keep_at(USERNS_FD, _user_namespace(host_id))
    os.chown(connection, host_id, host_id)
    os.setgroups([])
    os.setresgid(host_id, host_id, host_id)
    os.setresuid(host_id, host_id, host_id)
    ids = ["--userns", str(USERNS_FD), "--uid", str(host_id), "--gid", str(host_id)]
    return [bwrap_argv[0], *ids, *bwrap_argv[1:]]


def main(argv: list[str]) -> None:
    memory, size, tasks, cgroup, seccomp, connection, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: confine.py MEMORY FILE TASKS CGROUP SECCOMP CONNECTION -- CMD")
    for name, value in (("AS", memory), ("FSIZE", size), ("CORE", "0"), ("NPROC", tasks)):
        limit = getattr(resource, "RLIMIT_" + name)
        resource.setrlimit(limit, (int(value), int(value)))
    if cgroup:
        join_cgroup(cgroup)
    fresh_session_keyring()
    if seccomp:
        _keep_at(SECCOMP_FD, os.open(seccomp, os.O_RDONLY))
        if os.geteuid() == 0:
            command = drop_root(command, connection)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
