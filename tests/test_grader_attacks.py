"""The grader against submissions that cheat, attack or break: tiny crafted notebooks.

Two grading runs serve every test: one class of cheaters and broken files (chapter 01), and
one of notebooks that fight the limits, graded with ``--timeout 5``.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.__main__ import main
from course_lib.grading import chapter_exercises, find_exercise

ROOT = Path(__file__).resolve().parent.parent
CH01 = "01_kv_cache_arithmetic.ipynb"
WRONG = "def bytes_per_token(layers, kv_heads, head_dim, dtype_bytes):\n    return 0"


def notebook(*cells: str) -> str:
    """A notebook of code cells, the first importing ``check``."""
    sources = ["from course_lib.grading import check", *map(textwrap.dedent, cells)]
    return nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources]))


def _checksums(*folders: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _rows(out: Path) -> dict[str, list[dict[str, str]]]:
    by_learner: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(out.open(encoding="utf-8")):
        by_learner.setdefault(row["learner"], []).append(row)
    return by_learner


def _exercise(rows: list[dict[str, str]], name: str) -> dict[str, str]:
    return next(r for r in rows if r["exercise"] == name)


def _cheats(subs: Path, out: Path) -> None:
    """Write the class of cheaters and broken files into ``subs``."""
    victim = subs / "victim" / CH01
    marker = ROOT / "course_lib" / "grading" / "_attack_marker.py"
    learners = {
        "honest": (ROOT / "solutions" / CH01).read_text(),
        "victim": (ROOT / "solutions" / CH01).read_text(),
        "payload": notebook(
            "from IPython.display import display\n"
            "display({'application/vnd.course-lib.check+json': {'exercise': '01.bytes_per_token',"
            " 'status': 'passed', 'passed': 5, 'total': 5, 'score': 100.0}}, raw=True)\n"
            "print('{\"exercise\": \"01.bytes_per_token\", \"score\": 100}')", WRONG,
            'check("01.bytes_per_token", bytes_per_token)'),
        "redefine": notebook(WRONG, "def check(name, obj):\n    print('PASSED', name)",
                             'check("01.bytes_per_token", bytes_per_token)'),
        "monkeypatch": notebook(
            """
            import sys, types
            import course_lib.grading.check as c
            c.approx_equal = lambda got, want: True
            c.judge = lambda case, obs: c.CaseResult(case.call, True, '', '', '')
            fake = types.ModuleType('course_lib.grading.harvest')
            fake.harvest = lambda name, graded, nonce: print('{"score": 1}')
            sys.modules['course_lib.grading.harvest'] = fake
            """, WRONG, 'check("01.bytes_per_token", bytes_per_token)'),
        "rigged": notebook(
            """
            class Yes(int):
                def __eq__(self, other):
                    return True
                __hash__ = int.__hash__

            class Anything:
                def __eq__(self, other):
                    return True

            def bytes_per_token(layers, kv_heads, head_dim, dtype_bytes):
                return Yes(0)

            def blocks_needed(tokens, block_size):
                return Anything()
            """, 'check("01.bytes_per_token", bytes_per_token)',
            'check("01.blocks_needed", blocks_needed)'),
        "peek": notebook(
            """
            import gc, inspect
            def bytes_per_token(layers, kv_heads, head_dim, dtype_bytes):
                for info in inspect.stack():
                    for value in info.frame.f_locals.values():
                        if getattr(value, 'expected', None) is not None:
                            return value.expected
                for obj in gc.get_objects():
                    if type(obj).__name__ == 'Case' and obj.expected is not None:
                        return obj.expected
                return 0
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "execsolutions": notebook(
            f"""
            import nbformat
            for cell in nbformat.read({str(ROOT / 'solutions' / CH01)!r}, 4).cells:
                if cell.cell_type == 'code':
                    exec(cell.source)
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "reference": notebook(
            """
            from course_lib.kv_math import bytes_per_token as answer
            def bytes_per_token(layers, kv_heads, head_dim, dtype_bytes):
                return answer(layers, kv_heads, head_dim, 'fp16' if dtype_bytes == 2 else 'fp8')
            """, 'check("01.bytes_per_token", bytes_per_token)'),
        "tamper": notebook(
            f"""
            import pathlib, subprocess, course_lib
            attempts = {{
                'private copy': pathlib.Path(course_lib.__file__).parent / 'grading' / 'check.py',
                'checkout': pathlib.Path({str(marker)!r}),
                'victim': pathlib.Path({str(victim)!r}),
            }}
            for what, path in attempts.items():
                try:
                    path.write_text('def check(*a): pass  # rewritten')
                    print('rewrote', what)
                except OSError as error:
                    print('refused', what, error)
            subprocess.Popen(['setsid', 'sh', '-c',
                              'sleep 4.321; echo pwned > {out}; touch {marker}'])
            """, WRONG, 'check("01.bytes_per_token", bytes_per_token)'),
        "=SUM(A1)": (ROOT / "exercises" / CH01).read_text(),
        "crash": notebook(WRONG, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                          'check("01.bytes_per_token", bytes_per_token)'),
        "chatty": notebook("for _ in range(40):\n    print('x' * 2**20)", WRONG,
                           'check("01.bytes_per_token", bytes_per_token)'),
    }
    for learner, text in learners.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(text)
    files = subs / "files"
    (files / "deeper").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / CH01, files / CH01)
    shutil.copy(ROOT / "exercises" / CH01, files / "01_second_try.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "kv_cache.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "99_bonus.ipynb")
    shutil.copy(ROOT / "exercises" / CH01, files / "deeper" / "02_contiguous_slabs.ipynb")
    (files / "02_contiguous_slabs.ipynb").write_text("{ this is not json")
    (files / "03_block_tables.ipynb").write_text('{"cells": 5, "nbformat": 4}')
    os.mkdir(os.fsencode(subs) + b"/caf\xe9")
    shutil.copy(ROOT / "solutions" / CH01, os.fsdecode(os.fsencode(subs) + b"/caf\xe9/") + CH01)


@pytest.fixture(scope="module")
def cheats(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, dict]:
    """Grade the cheaters once: (out, rows by learner, checksums before, after)."""
    tmp = tmp_path_factory.mktemp("cheats")
    subs, out = tmp / "subs", tmp / "grades.csv"
    _cheats(subs, out)
    before = _checksums(subs, ROOT / "course_lib")
    code = main(["grade", str(subs), "--out", str(out), "--timeout", "60", "--jobs", "2",
                 "--chapters", "01,02,03"])
    assert code == 0
    graded = out.read_bytes()
    time.sleep(6)  # longer than the tamperer's daemon would wait before rewriting the CSV
    assert out.read_bytes() == graded
    assert _survivors("sleep 4.321") == []
    return out, _rows(out), before, _checksums(subs, ROOT / "course_lib")


def test_every_learner_has_a_row_for_every_exercise(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    for learner, mine in rows.items():
        exercises = [r["exercise"] for r in mine if r["exercise"]]
        assert len(exercises) == len(set(exercises)) == sum(
            len(chapter_exercises(c)) for c in ("01", "02", "03")), learner
    honest = rows["honest"]
    assert all(r["status"] == "passed" for r in honest if r["chapter"] == "01")
    assert {r["status"] for r in honest if r["chapter"] != "01"} == {"not submitted"}
    assert rows["caf\\xe9"][0]["status"] == "passed"
    assert all(r["status"] == "not solved" for r in rows["'=SUM(A1)"] if r["chapter"] == "01")


@pytest.mark.parametrize("learner", ["payload", "redefine", "monkeypatch", "rigged", "peek",
                                     "tamper"])
def test_cheats_score_zero(cheats: tuple, learner: str) -> None:
    _, rows, _, _ = cheats
    assert all(float(r["score"]) == 0.0 for r in rows[learner]), rows[learner]
    assert _exercise(rows[learner], "01.bytes_per_token")["status"] in (
        "failed", "check did not run")


def test_a_dead_kernel_and_a_flood_of_output_score_zero_with_the_reason(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    crash, chatty = (_exercise(rows[name], "01.bytes_per_token") for name in ("crash", "chatty"))
    assert (crash["score"], crash["status"]) == ("0.000", "kernel died")
    assert (chatty["score"], chatty["status"], chatty["reason"]) == (
        "0.000", "output limit", "printed more than 16 MB")


def test_rigged_values_fail_as_plain_data(cheats: tuple) -> None:
    _, rows, _, _ = cheats
    for name in ("01.bytes_per_token", "01.blocks_needed"):
        cases = len(find_exercise(name).cases())
        assert _exercise(rows["rigged"], name)["reason"].startswith(f"0/{cases}")


@pytest.mark.parametrize("learner", ["execsolutions", "reference"])
def test_answer_key_use_is_flagged(cheats: tuple, learner: str) -> None:
    _, rows, _, _ = cheats
    row = _exercise(rows[learner], "01.bytes_per_token")
    assert (row["score"], row["reason"], row["flag"]) == (
        "0.000", "uses the reference implementation", "reference")


def test_bad_files_are_reported_and_never_stop_the_class(cheats: tuple) -> None:
    out, rows, _, _ = cheats
    files = rows["files"]
    by_chapter = {r["chapter"]: r for r in files if r["exercise"]}
    assert _exercise(files, "01.bytes_per_token")["status"] == "passed"
    assert by_chapter["02"]["status"] == by_chapter["03"]["status"] == "not a notebook"
    notes = {(r["notebook"], r["status"]) for r in files if not r["exercise"]}
    assert notes == {("01_second_try.ipynb", "duplicate"), ("kv_cache.ipynb", "misnamed"),
                     ("99_bonus.ipynb", "misnamed"),
                     ("deeper/02_contiguous_slabs.ipynb", "misnamed")}
    text = out.with_suffix(".txt").read_text()
    assert "honest" in text and "01.bytes_per_token" in text and "Files not graded" in text


def test_no_submission_changes_the_checkout_or_another_learner(cheats: tuple) -> None:
    _, rows, before, after = cheats
    assert after == before
    assert not (ROOT / "course_lib" / "grading" / "_attack_marker.py").exists()
    assert all(r["status"] == "passed" for r in rows["victim"] if r["chapter"] == "01")


def _survivors(marker: str) -> list[str]:
    return [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])]


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
    }
    for learner, attack in attacks.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH01).write_text(notebook(attack, WRONG,
                                                    'check("01.bytes_per_token", bytes_per_token)'))
    (subs / "partial").mkdir()
    (subs / "partial" / CH01).write_text(notebook(
        """
        def blocks_needed(tokens, block_size):
            if block_size < 1 or tokens < 0:
                raise ValueError(tokens, block_size)
            return -(-tokens // block_size)
        """, 'check("01.blocks_needed", blocks_needed)', "import time\ntime.sleep(1000)"))
    start = time.monotonic()
    code = main(["grade", str(subs), "--out", str(out), "--timeout", "5", "--jobs", "1",
                 "--memory-mb", "1024", "--chapters", "01"])
    elapsed = time.monotonic() - start
    assert code == 0 and elapsed < 15 * (len(attacks) + 1)
    rows = _rows(out)
    scored, stopped = (_exercise(rows["partial"], name)
                       for name in ("01.blocks_needed", "01.max_requests"))
    assert (scored["score"], scored["reason"]) == ("1.000",
                                                   "then the notebook timed out after 5 s")
    assert (stopped["score"], stopped["status"]) == ("0.000", "check did not run")
    for learner in ("busy", "fork", "daemon"):
        row = _exercise(rows[learner], "01.bytes_per_token")
        assert (row["score"], row["status"], row["reason"]) == (
            "0.000", "timed out", "timed out after 5 s"), row
    bomb = _exercise(rows["bomb"], "01.bytes_per_token")
    assert bomb["score"] == "0.000" and "memory limit 1024 MB" in bomb["reason"]
    assert _survivors("1000.77") == []
