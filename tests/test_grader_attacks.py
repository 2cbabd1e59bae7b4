"""The grader against submissions that cheat, attack or break: tiny crafted notebooks.

Two grading runs serve every test: one class of cheaters, attackers and broken files
(chapter 01) beside honest learners, and one of notebooks that fight the limits, graded
with ``--timeout 5``. Each attack is written to score only if it works.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import socket
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.__main__ import main
from course_lib.grading import chapter_exercises

ROOT = Path(__file__).resolve().parent.parent
CH01 = "01_kv_cache_arithmetic.ipynb"
WRONG = "def bytes_per_token(layers, kv_heads, head_dim, dtype_bytes):\n    return 0"


def notebook(*cells: str) -> str:
    """A notebook of code cells, the first importing ``check``."""
    sources = ["from course_lib.grading import check", *map(textwrap.dedent, cells)]
    return nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources]))


def _digest(path: Path) -> str:
    """A file's content hash that reads only its data, not its holes.

    The size, then each data extent's offset and bytes: holes read as zeros, so this
    determines the content exactly, and the class's two sparse 8 GiB files hash in no time
    (read whole, they took a minute and a half of the run and 8 GiB of memory).
    """
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        fd, size, offset = handle.fileno(), os.fstat(handle.fileno()).st_size, 0
        digest.update(size.to_bytes(8, "little"))
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            digest.update(start.to_bytes(8, "little"))
            handle.seek(start)
            for _ in range(start, offset, 1 << 20):
                digest.update(handle.read(min(1 << 20, offset - handle.tell())))
    return digest.hexdigest()


def _checksums(*folders: Path) -> dict[str, str]:
    return {str(p): _digest(p) for folder in folders for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _rows(out: Path) -> dict[str, list[dict[str, str]]]:
    by_learner: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(out.open(encoding="utf-8")):
        by_learner.setdefault(row["learner"], []).append(row)
    return by_learner


def _exercise(rows: list[dict[str, str]], name: str) -> dict[str, str]:
    return next(r for r in rows if r["exercise"] == name)


def _spy(paths: list[str]) -> str:
    """A learner whose function is right only if it could read one of ``paths``."""
    return f"""
        import pathlib
        def bytes_per_token(config, cache_dtype="auto"):
            for path in {paths!r}:
                p = pathlib.Path(path)
                try:
                    if p.is_dir():
                        list(p.iterdir())
                    else:
                        p.read_bytes()
                    return CORRECT(config, cache_dtype)
                except OSError:
                    pass
            return 0
        """


def _correct_source() -> str:
    """The solution's bytes-per-token function, renamed ``CORRECT``."""
    cells = nbformat.read(ROOT / "solutions" / CH01, 4).cells
    source = next(c.source for c in cells if "def bytes_per_token" in c.source)
    return source.replace("def bytes_per_token", "def CORRECT")


def _cheats(subs: Path, out: Path, server: int) -> None:
    """Write the class of cheaters, attackers and broken files into ``subs``."""
    secret = out.parent / "instructor" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("the instructor's own file")
    (out.parent / "last-year.csv").write_text("learner,score\n")
    victim = subs / "victim" / CH01
    solution = (ROOT / "solutions" / CH01).read_text()
    honest_text = nbformat.reads(solution, 4)
    honest_text.cells[2:2] = [nbformat.v4.new_code_cell(
        "\n".join(["%time x = 1"] * 100 + ["%who"] * 100 + ["!true", "y = !true"]))]
    honest_text.cells.append(nbformat.v4.new_code_cell(
        "print('I checked my work against the solutions/ folder and solutions.ipynb')"))
    learners = {
        "honest": nbformat.writes(honest_text),
        "victim": solution,
        "forger": notebook(
            "from IPython.display import display\n"
            "display({'application/vnd.course-lib.check+json': {'exercise': '01.bytes_per_token',"
            " 'status': 'passed', 'passed': 5, 'total': 5, 'score': 100.0}}, raw=True)\n"
            "print('{\"exercise\": \"01.bytes_per_token\", \"score\": 100}')", WRONG,
            "def check(name, obj):\n    print('PASSED', name)",
            'check("01.bytes_per_token", bytes_per_token)'),
        "harvester": notebook(
            """
            import json, os, re, sys, pathlib
            import course_lib.grading.harvest as h
            import course_lib.grading.check as c
            found = [p.read_text() for p in pathlib.Path('.').rglob('*') if p.is_file()]
            def forged(shipped, graded, nonce):
                obs = [{"value": 131072, "shown": "131072"}]
                print(nonce + json.dumps({"calls": ["x"], "observations": obs}) + nonce)
            h.harvest = forged
            c.observe = lambda case, obj: {"value": 131072, "shown": "131072"}
            real_dumps = json.dumps
            json.dumps = lambda *a, **k: real_dumps({"calls": [], "observations": []})
            def rewrite(lines):
                text = "".join(lines)
                for nonce in re.findall(r"'([0-9a-f]{32})'", text):
                    print(nonce + '{"score": 1}' + nonce)
                return lines
            get_ipython().input_transformers_post.append(rewrite)
            """, WRONG, 'check("01.bytes_per_token", bytes_per_token)'),
        "runtime": notebook(
            """
            import base64, importlib, sys
            key = importlib.import_module("course_lib." + "kv_" + "math")
            by_name = getattr(key, "nekot_rep_setyb"[::-1])
            hidden = base64.b64decode(b"Y291cnNlX2xpYi5rdl9tYXRo").decode()
            scanned = [m for n, m in list(sys.modules.items()) if n.endswith("kv_math")]
            get_ipython().run_cell("from course_lib.kv_math import bytes_per_token as viacell")
            globals()["dynamic"] = importlib.import_module(hidden).bytes_per_token
            def bytes_per_token(config, cache_dtype="auto"):
                global_answer = by_name(config["num_hidden_layers"],
                                        config.get("num_key_value_heads", 1),
                                        config["hidden_size"] // config["num_attention_heads"],
                                        "fp16")
                return int(global_answer)
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "registry": notebook(
            """
            def bytes_per_token(config, cache_dtype="auto"):
                try:
                    from course_lib.grading import find_exercise
                    for case in find_exercise("01.bytes_per_token").cases():
                        if case.call.startswith("fn(config") and str(config) in case.call:
                            return case.expected
                except Exception:
                    pass
                return 0
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "copycat": notebook(
            f"""
            import json, pathlib
            def _classmates():
                for cmdline in pathlib.Path('/proc').glob('*/cmdline'):
                    for arg in cmdline.read_bytes().split(b'\\0'):
                        folder = pathlib.Path(arg.decode(errors='replace'))
                        if folder.is_dir() and any(folder.glob('*/01_*.ipynb')):
                            yield from folder.glob('*/01_*.ipynb')
                yield pathlib.Path({str(victim)!r})
            for path in _classmates():
                try:
                    cells = json.loads(path.read_text())['cells']
                except OSError:
                    continue
                for cell in cells:
                    code = ''.join(cell['source'])
                    if cell['cell_type'] == 'code' and 'def bytes_per_token' in code:
                        exec(code)
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "spy": notebook(_correct_source(), _spy([
            str(secret), str(secret.parent), str(victim), str(subs),
            *(str(Path.home() / name) for name in (".bashrc", ".profile", ".ssh", ".cache")),
            str(out.parent / "last-year.csv"), str(ROOT / "solutions" / CH01),
            str(ROOT / "course_lib" / "grading" / "ch01.py"), "/root/.ssh"]),
            'check("01.bytes_per_token", bytes_per_token)'),
        "escape": notebook(_correct_source(), f"""
            import os, signal, socket
            for pid in ({os.getpid()}, {os.getppid()}, 1):
                for sig in (signal.SIGSTOP, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            def bytes_per_token(config, cache_dtype="auto"):
                try:
                    socket.create_connection(("127.0.0.1", {server}), timeout=2).close()
                    return CORRECT(config, cache_dtype)
                except OSError:
                    return 0
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "numbersource": json.dumps({"cells": [{"cell_type": "code", "source": 5,
                                               "metadata": {}, "outputs": []}],
                                    "nbformat": 4, "nbformat_minor": 5, "metadata": {}}),
        "manycells": json.dumps({"cells": [{"cell_type": "code", "source": "x = 1",
                                            "metadata": {}, "outputs": []}] * 100_000,
                                 "nbformat": 4, "nbformat_minor": 5, "metadata": {}}),
        "=SUM(A1)": (ROOT / "exercises" / CH01).read_text(),
        "evil\n  honest  99.00\x1b[2J": solution,
        "crash": notebook(WRONG, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                          'check("01.bytes_per_token", bytes_per_token)'),
        "chatty": notebook("for _ in range(40):\n    print('x' * 2**20)", WRONG,
                           'check("01.bytes_per_token", bytes_per_token)'),
    }
    for learner, text in learners.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(text)
    with (subs / "spy" / "dataset.bin").open("wb") as handle:
        handle.truncate(8 << 30)  # a sparse 8 GiB file beside a notebook
    files = subs / "files"
    (files / "deeper").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / CH01, files / CH01)
    shutil.copy(ROOT / "exercises" / CH01, files / "01_second_try.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "kv_cache.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "99_bonus.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "deeper" / "02_contiguous_slabs.ipynb")
    (files / "02_contiguous_slabs.ipynb").write_text("{ this is not json")
    with (files / "03_block_tables.ipynb").open("wb") as handle:
        handle.truncate(8 << 30)  # a sparse 8 GiB notebook
    os.mkdir(os.fsencode(subs) + b"/caf\xe9")
    shutil.copy(ROOT / "solutions" / CH01, os.fsdecode(os.fsencode(subs) + b"/caf\xe9/") + CH01)


@pytest.fixture(scope="module")
def cheats(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, dict]:
    """Grade the class once: (out, rows by learner, checksums before, after)."""
    tmp = tmp_path_factory.mktemp("cheats")
    subs, out = tmp / "subs", tmp / "grades.csv"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        _cheats(subs, out, server.getsockname()[1])
        before = _checksums(subs, ROOT / "course_lib")
        code = main(["grade", str(subs), "--out", str(out), "--timeout", "60", "--jobs", "2",
                     "--chapters", "01,02,03"])
    assert code == 0
    return out, _rows(out), before, _checksums(subs, ROOT / "course_lib")


def test_every_learner_has_a_row_for_every_exercise(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    for learner, mine in rows.items():
        exercises = [r["exercise"] for r in mine if r["exercise"]]
        assert len(exercises) == len(set(exercises)) == sum(
            len(chapter_exercises(c)) for c in ("01", "02", "03")), learner
    for learner in ("honest", "victim", "caf\\xe9"):
        assert {r["status"] for r in rows[learner] if r["chapter"] == "01"} == {"passed"}, (
            learner, rows[learner])
    assert {r["status"] for r in rows["honest"] if r["chapter"] != "01"} == {"not submitted"}
    assert all(r["status"] == "not solved" for r in rows["'=SUM(A1)"] if r["chapter"] == "01")


def test_honest_magics_and_text_about_solutions_are_not_flagged(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    assert all(r["flag"] == "" and r["reason"] == "" for r in rows["honest"]
               if r["chapter"] == "01")


@pytest.mark.parametrize("learner", ["forger", "harvester", "registry", "copycat", "spy",
                                     "escape"])
def test_cheats_and_attacks_score_zero(cheats: tuple, learner: str) -> None:
    _, rows, _, _ = cheats
    assert all(float(r["score"]) == 0.0 for r in rows[learner]), rows[learner]


def test_the_reference_built_at_run_time_refuses_and_is_named(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    row = _exercise(rows["runtime"], "01.bytes_per_token")
    assert (row["score"], row["status"], row["flag"]) == ("0.000", "flagged", "reference")
    assert row["reason"] == ("uses the reference implementation (course_lib.kv_math."
                             "bytes_per_token is not available while grading)")


def test_every_notebook_shape_ends_in_a_row_with_a_reason(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    number = _exercise(rows["numbersource"], "01.bytes_per_token")
    assert (number["status"], number["reason"]) == (
        "not a notebook", "not a valid notebook (code cell 1's source is not text)")
    many = _exercise(rows["manycells"], "01.bytes_per_token")
    assert many["status"] == "not a notebook" and "code cells" in many["reason"]


def test_a_dead_kernel_and_a_flood_of_output_score_zero_with_the_reason(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    crash, chatty = (_exercise(rows[name], "01.bytes_per_token") for name in ("crash", "chatty"))
    assert (crash["score"], crash["status"]) == ("0.000", "kernel died")
    assert (chatty["score"], chatty["status"], chatty["reason"]) == (
        "0.000", "output limit", "printed more than 16 MB")


def test_bad_files_are_reported_and_never_stop_the_class(cheats: tuple) -> None:
    out, rows, _, _ = cheats
    files = rows["files"]
    by_chapter = {r["chapter"]: r for r in files if r["exercise"]}
    assert _exercise(files, "01.bytes_per_token")["status"] == "passed"
    assert by_chapter["02"]["status"] == by_chapter["03"]["status"] == "not a notebook"
    assert by_chapter["03"]["reason"] == "larger than 50 MB"
    notes = {(r["notebook"], r["status"]) for r in files if not r["exercise"]}
    assert notes == {("01_second_try.ipynb", "duplicate"), ("kv_cache.ipynb", "misnamed"),
                     ("99_bonus.ipynb", "misnamed"),
                     ("deeper/02_contiguous_slabs.ipynb", "misnamed")}
    text = out.with_suffix(".txt").read_text()
    assert "honest" in text and "01.bytes_per_token" in text and "Files not graded" in text


def test_names_cannot_forge_lines_or_send_escape_codes(cheats: tuple) -> None:
    out, rows, _, _ = cheats
    evil = "evil\\u000a  honest  99.00\\u001b[2J"  # shown with unambiguous escapes
    assert {r["status"] for r in rows[evil] if r["chapter"] == "01"} == {"passed"}
    text = out.with_suffix(".txt").read_text()
    assert "\x1b" not in text and not any(line.startswith("  honest  99") for line in
                                             text.splitlines())
    assert "\x1b" not in out.read_text()


def test_no_submission_changes_the_checkout_or_another_learner(cheats: tuple) -> None:
    _, rows, before, after = cheats
    assert after == before
    assert all(r["status"] == "passed" for r in rows["victim"] if r["chapter"] == "01")


def _survivors(marker: str) -> list[str]:
    return [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])]


def test_a_notebook_over_the_output_cap_ends_there_not_at_the_timeout(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "grades.csv"
    (subs / "printer").mkdir(parents=True)
    (subs / "printer" / CH01).write_text(notebook(
        "print('x' * (40 << 20))", WRONG, 'check("01.bytes_per_token", bytes_per_token)'))
    start = time.monotonic()
    code = main(["grade", str(subs), "--out", str(out), "--timeout", "120", "--chapters", "01"])
    elapsed = time.monotonic() - start  # it waited out the 120 s before the kernel's kill
    row = _exercise(_rows(out)["printer"], "01.bytes_per_token")
    assert code == 0 and (row["status"], row["reason"]) == ("output limit",
                                                           "printed more than 16 MB")
    assert elapsed < 60, f"grading took {elapsed:.0f} s"


def test_limits_end_every_process_within_the_timeout(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "grades.csv"
    attacks = {
        "busy": "sum(range(10**12))",
        "fork": """
            import os
            if os.fork() == 0:
                os.execvp('sleep', ['sleep', '1000.771'])
            os.wait()
            """,
        "daemon": """
            import subprocess, time
            subprocess.Popen(['setsid', 'sleep', '1000.772'], start_new_session=True)
            time.sleep(1000)
            """,
        "bomb": "hog = [bytearray(50 * 2**20) for _ in range(1000)]",
        "survivor": """
            import os, subprocess, sys
            churn = (
                "import os, signal, time\\n"
                "kernel = int(os.environ['KERNEL'])\\n"
                "while True:\\n"
                "    if os.fork():\\n"
                "        os._exit(0)\\n"
                "    for pid in map(int, filter(str.isdigit, os.listdir('/proc'))):\\n"
                "        if pid not in (os.getpid(), kernel):\\n"
                "            try: os.kill(pid, signal.SIGKILL)\\n"
                "            except OSError: pass\\n"
                "    time.sleep(0.01)\\n")
            subprocess.Popen([sys.executable, "-c", churn, "1000.773"],
                             env={**os.environ, "KERNEL": str(os.getpid())},
                             start_new_session=True)
            """,
    }
    for learner, attack in attacks.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(notebook(attack, WRONG,
                                                    'check("01.bytes_per_token", bytes_per_token)'))
    (subs / "zz-follower").mkdir()
    shutil.copy(ROOT / "solutions" / CH01, subs / "zz-follower" / CH01)
    (subs / "partial").mkdir()
    (subs / "partial" / CH01).write_text(notebook(
        """
        def blocks_needed(tokens, block_size):
            if block_size < 1 or tokens < 0:
                raise ValueError(tokens, block_size)
            return -(-tokens // block_size)
        """, 'check("01.blocks_needed", blocks_needed)', "import time\ntime.sleep(1000)"))
    start = time.monotonic()
    code = main(["grade", str(subs), "--out", str(out), "--timeout", "5", "--jobs", "2",
                 "--memory-mb", "1024", "--chapters", "01"])
    elapsed = time.monotonic() - start
    assert code == 0 and elapsed < 20 * (len(attacks) + 2)
    rows = _rows(out)
    scored, stopped = (_exercise(rows["partial"], name)
                       for name in ("01.blocks_needed", "01.max_requests"))
    assert (scored["score"], scored["reason"]) == ("1.000",
                                                   "then the notebook timed out after 5 s")
    assert (stopped["score"], stopped["status"]) == ("0.000", "check did not run")
    assert {r["status"] for r in rows["zz-follower"]} == {"passed"}, rows["zz-follower"]
    for learner in ("busy", "fork", "daemon"):
        row = _exercise(rows[learner], "01.bytes_per_token")
        assert (row["score"], row["status"], row["reason"]) == (
            "0.000", "timed out", "timed out after 5 s"), row
    bomb = _exercise(rows["bomb"], "01.bytes_per_token")
    assert bomb["score"] == "0.000" and bomb["status"] == "failed"  # its MemoryError was its own
    assert _survivors("1000.77") == []
    assert _exercise(rows["survivor"], "01.bytes_per_token")["status"] == "failed"
