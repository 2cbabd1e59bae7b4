"""The sandbox against kernels that reach for the host: keyrings, /proc/sys, disk, memory,
the grader's own memory, the files they leave behind, and the layouts the course is
installed in.

One grading run serves the attacks (chapter 01, ``--memory-mb 2048``), with a classmate
graded after them; each attack's function is right only if its attack worked, so a score of
zero says it failed. The run is repeated as an ordinary user where that differs (no cgroup,
no uid to drop).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_lib.__main__ import main
from course_lib.grading import execute as execute_module
from course_lib.grading import grade as grade_module
from course_lib.grading import sandbox
from course_lib.grading.execute import Kernel, Limits, _new_root, _prepare, _remove
from course_lib.grading.grade import grade_folder
from course_lib.limits import GRADER_MIN_MEMORY_MB
from tests.test_grader_attacks import CH01, ROOT, _correct_source, _exercise, _rows, notebook
from tests.test_grader_sandbox import _class, _user_environment

KEY = b"course-grader-test"
GRADER_PIDS: list[str] = []
"""The pid of each grader process this module ran, in order (its folders carry it)."""
SYSCTLS = ("/proc/sys/vm/swappiness", "/proc/sys/kernel/core_pattern")
NO_KEYRING = 77
"""The exit status of a grading process that could not plant the instructor's key."""

ATTACKS = {
    "keyring-read": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        keys = open("/proc/keys", "rb").read()  # every key this user may view
        found = (libc.syscall(250, 10, -3, b"user", KEY, 0) > 0  # KEYCTL_SEARCH @s
                 or libc.syscall(250, 10, -4, b"user", b"planted", 0) > 0  # a classmate's, @u
                 or b"course-grader" in keys or b"planted" in keys)
        """,
    "keyring-plant": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        planted = libc.syscall(248, b"user", b"planted", b"x", 1, -4)  # add_key to @u
        cleared = libc.syscall(250, 7, -3, 0)  # KEYCTL_CLEAR the session keyring
        found = planted > 0 or cleared == 0
        """,
    "sysctl": """
        found = False
        for path, value in (("/proc/sys/vm/swappiness", "59"),
                            ("/proc/sys/kernel/core_pattern", "|/bin/true")):
            try:
                open(path, "w").write(value)
                found = True
            except OSError:
                pass
        """,
    "filler": """
        import os
        written = 0
        chunk = b"x" * (1 << 20)
        for folder in (os.getcwd(), "/tmp", "/dev/shm", "/ipc", "/", os.environ["MPLCONFIGDIR"]):
            try:
                with open(os.path.join(folder, "fill"), "wb") as handle:
                    for _ in range(1100):
                        handle.write(chunk)
                        written += 1
            except OSError:
                pass
        found = written >= 1024 + 600
        """,
    "memfd": """
        import mmap, os
        held = []
        try:
            for _ in range(4):
                fd = os.memfd_create("hold")
                os.ftruncate(fd, 512 << 20)
                view = mmap.mmap(fd, 512 << 20)
                view.write(b"x" * (512 << 20))
                held.append(view)
        except OSError:
            pass
        found = len(held) == 4
        """,
    "nester": """
        from IPython.display import display
        chain = []
        for _ in range(800):
            chain = [chain]
        display({"application/json": [chain] * 9600}, raw=True)  # 15 MB, 7.7 million lists
        found = False
        """,
    "spammer": """
        import time
        kernel = get_ipython().kernel
        blob = ('{"x": [' + ", ".join(["[" * 800 + "]" * 800] * 9300) + ']}').encode()
        start = time.time()
        while time.time() - start < 60:  # messages of a made-up kind no output cap counts
            kernel.session.send(kernel.iopub_socket, "x_spam", content=blob, parent=None)
            time.sleep(0.05)
        found = False
        """,
    "frames": """
        import time
        kernel = get_ipython().kernel
        big = memoryview(bytearray(16 << 20))  # one message of 24 frames of 16 MB each
        kernel.session.send(kernel.stdin_socket, "input_request", content={"prompt": ""},
                            parent=kernel.get_parent(), ident=kernel._parent_ident["shell"],
                            buffers=[big] * 24)
        time.sleep(3)
        found = False
        """,
    "amplifier": """
        import time
        kernel = get_ipython().kernel
        count = (15 << 20) // 5  # 3 million one-letter strings: 15 MB, 260 MB parsed
        body = ('{"name": "stdout", "text": [' + '"\u0100",' * (count - 1) + '"\u0100"]}')
        kernel.session.send(kernel.iopub_socket, "stream", content=body.encode(),
                            parent=kernel.get_parent())
        time.sleep(5)
        found = False
        """,
    "redirect": """
        import json, os, socket, time
        from ipykernel.kernelapp import IPKernelApp
        kernel = get_ipython().kernel
        info = json.load(open(IPKernelApp.instance().connection_file))
        stdin = f"{info['ip']}-{info['stdin_port']}"
        trap = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        trap.bind("/ipc/trap"); trap.listen(5); trap.settimeout(0.3)
        kernel.stdin_socket.close(linger=0)
        time.sleep(0.3)
        if os.path.lexists(stdin):
            os.unlink(stdin)
        found = False
        near = os.getuid() - (1 << 30)  # the host pid of the sandbox is near its uid's offset
        for pid in range(near, near + 6):
            os.symlink(f"/proc/{pid}/root/ipc/trap", "/ipc/link")
            os.rename("/ipc/link", stdin)
            end = time.time() + 2
            while time.time() < end and not found:
                try:
                    found = bool(trap.accept())  # the grader followed the link to the trap
                except socket.timeout:
                    pass
        """,
    "litter": """
        import os, stat
        os.symlink("/usr", "into-usr")
        os.symlink("/", "/tmp/root-link")
        path = "deep"
        for _ in range(1200):
            os.mkdir(path)
            path = os.path.join(path, "d")
            if len(path) > 3000:
                os.chdir(path.rpartition("/")[0]); path = "d"
        os.chdir(os.environ["HOME"])
        open("setuid", "w").close()
        os.chmod("setuid", 0o6755)
        os.mkdir("locked"); open("locked/x", "w").close(); os.chmod("locked", 0)
        found = False
        """,
}


def _attacker(attack: str) -> str:
    """A chapter 01 notebook whose ``bytes_per_token`` is right only if ``attack`` worked."""
    return notebook(f"KEY = {KEY!r}", attack, _correct_source(), """
        def bytes_per_token(config, cache_dtype="auto"):
            return CORRECT(config, cache_dtype) if found else 0
        """, 'check("01.bytes_per_token", bytes_per_token)')


def _session_key() -> int:
    """Add a key to this process's session keyring, as an instructor's session holds one."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(248, b"user", KEY, b"instructor's secret", 19, -3)
    if key < 0:
        pytest.skip(f"no session keyring here (errno {ctypes.get_errno()})")
    return key


def _key_text(key: int) -> bytes:
    buffer = ctypes.create_string_buffer(64)
    size = ctypes.CDLL(None).syscall(250, 11, key, buffer, 64)  # KEYCTL_READ
    return buffer.raw[:size] if size >= 0 else b""


def _class_of_attackers(subs: Path) -> None:
    for learner, attack in ATTACKS.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(_attacker(attack))
    (subs / "printer").mkdir()
    (subs / "printer" / CH01).write_text(notebook(
        "print('x' * (400 << 20))", _correct_source().replace("CORRECT", "bytes_per_token"),
        'check("01.bytes_per_token", bytes_per_token)'))
    (subs / "zz-classmate").mkdir()
    shutil.copy(ROOT / "solutions" / CH01, subs / "zz-classmate" / CH01)


def _grade_in_a_process(python: str, subs: Path, out: Path, env: dict[str, str],
                        user: list[str], prelude: str = "") -> tuple[int, int, str]:
    """(exit status, the grader's own peak memory in MB, stderr) of ``grade`` run by
    ``python`` in a process of its own (``user``: a setpriv prefix, or none), which runs
    ``prelude`` before it grades."""
    script = ("import os, sys\nfrom course_lib.__main__ import main\n"
              "print('grader-pid', os.getpid(), flush=True)\n" + prelude +
              "code = main(sys.argv[1:])\n"  # VmHWM: this image's own peak (ru_maxrss would
              "print('peak-kb', [line.split()[1] for line in open('/proc/self/status')\n"
              "                  if line.startswith('VmHWM')][0])\n"  # count the parent's)
              "sys.exit(code)\n")
    done = subprocess.run([*user, python, "-c", script, "grade", str(subs), "--out", str(out),
                           "--memory-mb", "2048", "--jobs", "2", "--timeout", "120",
                           "--chapters", "01"], env=env, capture_output=True, text=True,
                          timeout=900, cwd=out.parent)
    peak = [line for line in done.stdout.splitlines() if line.startswith("peak-kb")]
    GRADER_PIDS.append(done.stdout.split("grader-pid ", 1)[-1].split()[0])
    return done.returncode, int(peak[-1].split()[1]) >> 10 if peak else -1, done.stderr


def _assert_attacks_failed(out: Path, peak_mb: int) -> None:
    rows = _rows(out)
    for learner in ATTACKS:
        row = _exercise(rows[learner], "01.bytes_per_token")
        assert row["score"] == "0.000", (learner, row)
    printer = _exercise(rows["printer"], "01.bytes_per_token")
    assert printer["status"] == "output limit" and "more than 16 MB" in printer["reason"], printer
    assert {r["status"] for r in rows["zz-classmate"]} == {"passed"}, rows["zz-classmate"]
    assert 0 < peak_mb < 300, f"the grader peaked at {peak_mb} MB"
    summary = out.with_suffix(".txt").read_text()
    assert "Memory bound:" in summary


@pytest.fixture(scope="module")
def as_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict, int, str]:
    """Grade the attackers once as this user: (out, peak MB, sysctls before, key, folder)."""
    tmp = tmp_path_factory.mktemp("host")
    subs, out, runs = tmp / "subs", tmp / "grades.csv", tmp / "runs"
    runs.mkdir()
    _class_of_attackers(subs)
    key = _session_key()
    sysctls = {path: Path(path).read_text() for path in SYSCTLS}
    env = {**os.environ, "TMPDIR": str(runs)}
    code, peak, err = _grade_in_a_process(sys.executable, subs, out, env, [])
    assert code == 0, err[-3000:]
    return out, peak, sysctls, key, str(runs)


def test_no_attack_on_the_host_scores_and_the_classmate_passes(as_root: tuple) -> None:
    out, peak, _, _, _ = as_root
    _assert_attacks_failed(out, peak)


def test_the_instructors_keyring_and_the_hosts_sysctls_are_untouched(as_root: tuple) -> None:
    _, _, sysctls, key, _ = as_root
    assert _key_text(key) == b"instructor's secret"
    assert {path: Path(path).read_text() for path in SYSCTLS} == sysctls


def test_nothing_is_left_behind(as_root: tuple) -> None:
    _, _, _, _, runs = as_root
    assert os.listdir(runs) == []
    prefix = f"cg-{GRADER_PIDS[0]}-"  # the run's own folders and cgroups, not another's
    assert not [name for name in os.listdir("/tmp") if name.startswith(prefix)]
    parent = sandbox.memory_cgroup()
    if parent is not None:
        assert not [p for p in parent.iterdir() if p.name.startswith(prefix)]


def _in_sandbox(code: str) -> str:
    """What ``code`` prints run by the interpreter in a chapter 01 sandbox, as a kernel is."""
    root = _new_root()
    layout = None
    try:
        layout, env, argv = _prepare(root, Kernel(sandbox.library_copy("01"),
                                                  sandbox.check_available()), Limits(),
                                     [sys.executable, "-c", code])
        (layout.run / "kernel.json").write_text("{}")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        sandbox.remove_cgroup(layout.cgroup if layout else "")
        _remove(root)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_kernel_runs_as_no_host_user_of_its_own_when_root_grades() -> None:
    if os.geteuid() != 0:
        pytest.skip("grading as root only")
    uid, gid, *mapping = _in_sandbox(
        "import os; print(os.getuid(), os.getgid(), open('/proc/self/uid_map').read())").split()
    assert int(uid) == int(gid) >= 1 << 30
    assert mapping == ["0", "0", "1", uid, uid, "1"]


SYSCALLS = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
calls = {"keyctl": (250, 0, -3, 0), "add_key": (248, b"user", b"k", b"v", 1, -3),
         "unshare": (272, 0x10000000), "setns": (308, 0, 0), "ptrace": (101, 0, 0, 0, 0),
         "perf_event_open": (298, 0, 0, -1, -1, 0), "memfd_create": (319, b"m", 0),
         "shmget": (29, 0, 4096, 0o1600), "io_uring_setup": (425, 1, 0), "clone3": (435, 0, 0)}
found = {}
for name, (number, *args) in calls.items():
    result = libc.syscall(number, *args)
    found[name] = ctypes.get_errno() if result < 0 else "allowed"
print(json.dumps(found))
"""
"""x86-64 calls that, unfiltered, an unprivileged process may make or that fail with another
error than EPERM here (EINVAL for setns on a file, EFAULT for a missing argument): EPERM
from each is the filter's."""


def test_the_seccomp_filter_denies_what_container_runtimes_deny() -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86-64 system call numbers")
    import errno
    import json

    found = json.loads(_in_sandbox(SYSCALLS))
    assert found.pop("clone3") == errno.ENOSYS  # so the C library falls back to clone
    assert found == dict.fromkeys(found, errno.EPERM), found


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="drops to an ordinary user with setpriv, so runs as root")
def test_the_same_attacks_fail_graded_as_an_ordinary_user(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="grade-host-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        python = _user_environment(folder)
        work = folder / "work"
        _class_of_attackers(work / "subs")
        for path in [work, *work.rglob("*")]:
            os.chown(path, 65534, 65534)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8",
               "PYTHONPATH": str(folder / "src"), "TMPDIR": str(work)}
        # The instructor's key in their user keyring: a kernel runs as the instructor's own
        # uid here, so /proc/keys would list it unless the sandbox masks it.
        plant = ("import ctypes, sys\n"
                 f"if ctypes.CDLL(None).syscall(248, b'user', {KEY!r}, b'x', 1, -4) < 0:\n"
                 f"    sys.exit({NO_KEYRING})\n")
        code, peak, err = _grade_in_a_process(
            str(python), work / "subs", work / "grades.csv", env,
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], plant)
        if code == NO_KEYRING:
            pytest.skip("no user keyring here to plant the instructor's key in")
        assert code == 0, err[-3000:]
        _assert_attacks_failed(work / "grades.csv", peak)
        assert "no cgroup could be made here" in (work / "grades.txt").read_text()
        assert sorted(os.listdir(work)) == ["grades.csv", "grades.manifest.json", "grades.txt",
                                            "subs"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_memory_limit_too_small_to_start_a_kernel_is_refused_up_front(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", str(tmp_path), "--memory-mb", str(GRADER_MIN_MEMORY_MB - 1)]) == 2
    assert f"--memory-mb: must be an integer from {GRADER_MIN_MEMORY_MB:,}" in (
        capsys.readouterr().err)
    with pytest.raises(ValueError, match=f"memory at least {GRADER_MIN_MEMORY_MB} MB"):
        grade_folder(tmp_path, Limits(memory_mb=512))


def test_at_the_least_memory_every_kernel_starts(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    for learner in ("a", "b", "c", "d"):
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(notebook(
            "import numpy, torch", _correct_source().replace("CORRECT", "bytes_per_token"),
            'check("01.bytes_per_token", bytes_per_token)'))
    report = grade_folder(subs, Limits(memory_mb=GRADER_MIN_MEMORY_MB, timeout=120), jobs=2,
                          chapters=["01"])
    assert not report.problems
    assert {r.status for r in report.rows if r.exercise == "01.bytes_per_token"} == {"passed"}


def test_where_no_kernel_can_start_grade_says_why_once_before_grading_anyone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    subs = _class(tmp_path)
    stdlib_only = tuple(p for p in sandbox.import_paths() if "-packages" not in p)
    for module in (sandbox, execute_module):  # the packages' folders forgotten
        monkeypatch.setattr(module, "import_paths", lambda: stdlib_only)
    monkeypatch.setattr(sandbox, "python_paths", lambda: [str(Path(sys.prefix) / "bin"),
                                                          sys.base_prefix])
    monkeypatch.setattr(grade_module, "execute", None)  # grading anyone would fail loudly
    with pytest.raises(sandbox.SandboxUnavailable, match="No module named"):
        grade_folder(subs, Limits(timeout=60), chapters=["01"])


def _installed_environment(folder: Path, layout: str) -> Path:
    """A venv with the course installed without ``-e``: in its site-packages
    (``"site-packages"``), or with every package in a folder a ``.pth`` file adds (``"pth"``)."""
    python = _user_environment(folder)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    shutil.move(str(folder / "src" / "course_lib"), site / "course_lib")
    if layout == "pth":
        shutil.move(str(site), folder / "elsewhere")
        site.mkdir()
        (site / "elsewhere.pth").write_text(f"{folder / 'elsewhere'}\n")
    return python


SNOOP = """
    import pathlib, sys
    found = False
    for folder in map(pathlib.Path, sys.path):
        source = folder / "course_lib" / "kv_math.py"
        try:
            found = found or "\ndef bytes_per_token(" in source.read_text()  # top level
        except OSError:
            pass
    """


@pytest.mark.parametrize("layout", ["site-packages", "pth"])
def test_any_install_layout_grades_and_shows_no_answer_key(tmp_path: Path, layout: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="grade-layout-", dir="/tmp"))
    try:
        python = _installed_environment(folder, layout)
        subs = tmp_path / "subs"
        (subs / "snoop").mkdir(parents=True)
        (subs / "snoop" / CH01).write_text(_attacker(SNOOP))
        (subs / "zz-classmate").mkdir()
        shutil.copy(ROOT / "solutions" / CH01, subs / "zz-classmate" / CH01)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        code, _, err = _grade_in_a_process(str(python), subs, tmp_path / "grades.csv", env, [])
        assert code == 0, err[-3000:]
        rows = _rows(tmp_path / "grades.csv")
        assert _exercise(rows["snoop"], "01.bytes_per_token")["score"] == "0.000"
        assert {r["status"] for r in rows["zz-classmate"]} == {"passed"}, rows["zz-classmate"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
