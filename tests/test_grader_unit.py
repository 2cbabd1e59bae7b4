"""The grader's parts that run no kernel: plain data, judging, static reading, inventory, CSV."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.grading import GRADING_ENV, check, find_exercise
from course_lib.grading.check import NotPlainData, observe, to_plain
from course_lib.grading.grade import GradeRow, judge_harvest
from course_lib.grading.report import output_paths, safe_cell, summary, write_csv
from course_lib.grading.source import graded_checks, parse_cells, reads_solutions, uses_reference
from course_lib.grading.submissions import find_submissions

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(plain)
def test_plain_data_is_its_own_plain_form_and_survives_json(value: object) -> None:
    assert to_plain(value) == value
    assert json.loads(json.dumps(to_plain(value))) == value


@given(st.lists(st.integers(), max_size=5))
def test_tuples_become_lists(values: list[int]) -> None:
    assert to_plain(tuple(values)) == values


def test_rigged_values_lose_their_tricks() -> None:
    class Yes(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    got = to_plain(Yes(0))
    assert type(got) is int and got != 5
    with pytest.raises(NotPlainData, match="Anything"):
        to_plain(Anything())
    assert to_plain({1: [2], Yes(3): 4}) == {"1": [2], "3": 4}
    with pytest.raises(NotPlainData, match="1 and '1'"):
        to_plain({1: 2, "1": 3})
    with pytest.raises(NotPlainData, match="tuple key"):
        to_plain({(1, 2): 3})


def test_arrays_and_tensors_become_nested_lists() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert to_plain(np.array([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert to_plain(np.float32(0.5)) == 0.5
    nan = to_plain(torch.tensor([1.0, float("nan")]))
    assert nan[0] == 1.0 and nan[1] != nan[1]


def _cases(name: str) -> list:
    return list(find_exercise(name).cases())


def _harvest(name: str, fn: object) -> dict:
    cases = _cases(name)
    return {"exercise": name, "calls": [c.call for c in cases],
            "observations": [observe(c, fn) for c in cases]}


def _kib(n: int) -> float:
    if n < 0:
        raise ValueError(n)
    return n / 1024


def test_judging_a_harvest_scores_in_this_process() -> None:
    exercise, cases = find_exercise("00.to_kib"), _cases("00.to_kib")
    assert judge_harvest(json.dumps(_harvest("00.to_kib", _kib)), exercise, cases) == (
        1.0, "passed", "")
    score, status, reason = judge_harvest(json.dumps(_harvest("00.to_kib", lambda n: n // 1024)),
                                          exercise, cases)
    assert (score, status) == (0.6, "failed") and "3/5 cases passed" in reason


@pytest.mark.parametrize("damage", [
    lambda p: p.pop("observations"),
    lambda p: p.update(calls=["fn(0)"]),
    lambda p: p.update(exercise="00.other"),
    lambda p: p["observations"][0].pop("shown"),
    lambda p: p["observations"][0].update(shown=5),
    lambda p: p["observations"][0].update(raised="ValueError"),
    lambda p: p["observations"].pop(),
    lambda p: p.update(score=100, status="passed"),
    lambda p: p["observations"][0].update(passed=True),
])
def test_malformed_harvests_score_zero_never_crash(damage: object) -> None:
    payload = _harvest("00.to_kib", _kib)
    damage(payload)  # type: ignore[operator]
    score, status, _ = judge_harvest(json.dumps(payload), find_exercise("00.to_kib"),
                                     _cases("00.to_kib"))
    assert (score, status) == (0.0, "invalid result")
    assert judge_harvest("{not json", find_exercise("00.to_kib"), _cases("00.to_kib"))[0] == 0


def _trees(*cells: str) -> list:
    return parse_cells(list(cells))


def test_the_last_check_per_exercise_is_graded_and_magics_parse() -> None:
    trees = _trees("%matplotlib inline\nimport os", "def f(n): return 1",
                   'check("00.to_kib", f)', "def g(n): return 2", 'check("00.to_kib", g)',
                   "this is ( not python")
    assert graded_checks(trees, ["00.to_kib"])["00.to_kib"].expression == "g"
    assert graded_checks(trees, ["00.to_kib"])["00.to_kib"].cell == 4


REF = ("course_lib.paged.PagedKVManager.fork",)


@pytest.mark.parametrize(("cells", "flagged"), [
    (["from course_lib.paged import PagedKVManager",
      "def fork(m, a, b):\n    return PagedKVManager.fork(m, a, b)"], True),
    (["import course_lib.paged as p", "def fork(m, a, b):\n    return p.PagedKVManager.fork"],
     True),
    (["from course_lib.paged import PagedKVManager as K",
      "def helper(m, a, b):\n    k = K(m)\n    k.fork(a, b)",
      "def fork(m, a, b):\n    return helper(m, a, b)"], True),
    (["import importlib",
      "def fork(m, a, b):\n    return importlib.import_module('course_lib.paged')"], True),
    (["from course_lib.grading.ch04 import EXERCISES",
      "def fork(m, a, b):\n    return EXERCISES[0].cases()"], True),
    (["from course_lib.paged import PagedKVManager, BlockPool",
      "demo = PagedKVManager(BlockPool(4, 4))\ndemo.fork",
      "def fork(pool: BlockPool, a, b):\n    pool.share(a)\n    return b"], False),
])
def test_reference_use_is_found_in_the_graded_code_only(cells: list[str], flagged: bool) -> None:
    trees = _trees(*cells, 'check("04.fork", fork)')
    check = graded_checks(trees, ["04.fork"])["04.fork"]
    assert uses_reference(trees, check, REF) is flagged


def test_reading_the_solutions_is_found() -> None:
    assert reads_solutions(_trees("exec(open('../solutions/01_x.ipynb').read())"))
    assert reads_solutions(_trees("%run ../solutions/01_kv_cache_arithmetic.ipynb"))
    assert not reads_solutions(_trees("print('my solutions are my own')"))


def _nb() -> str:
    return nbformat.writes(nbformat.v4.new_notebook())


def test_inventory_accounts_for_every_file(tmp_path: Path) -> None:
    alice = tmp_path / "alice"
    (alice / "sub").mkdir(parents=True)
    for name in ("01_a.ipynb", "01_b.ipynb", "notes.ipynb", "99_extra.ipynb", "sub/02_x.ipynb"):
        (alice / name).write_text(_nb())
    (alice / ".ipynb_checkpoints").mkdir()
    (alice / ".ipynb_checkpoints" / "01_a-checkpoint.ipynb").write_text(_nb())
    os.mkdir(os.fsencode(tmp_path) + b"/caf\xe9")
    (tmp_path / "02_loose.ipynb").write_text(_nb())
    inventory = find_submissions(tmp_path, ("01", "02"))
    assert inventory.learners == ["alice", "caf\\xe9"]
    assert list(inventory.graded) == [("alice", "01")]
    notes = {(n.name, n.status) for n in inventory.notes}
    assert notes == {("01_b.ipynb", "duplicate"), ("notes.ipynb", "misnamed"),
                     ("99_extra.ipynb", "misnamed"), ("sub/02_x.ipynb", "misnamed"),
                     ("02_loose.ipynb", "misnamed")}


def test_csv_cells_never_become_formulas(tmp_path: Path) -> None:
    rows = [GradeRow("=SUM(A1:A9)", "01", "+1.ipynb", "01.x", 1.0, "passed", "-oops", ""),
            GradeRow("@bob", "01", "01_a.ipynb", "01.x", 0.0, "failed", "\tx", "")]
    write_csv(rows, tmp_path / "g.csv")
    cells = [c for row in csv.reader((tmp_path / "g.csv").open()) for c in row]
    assert not any(c[:1] in "=+-@\t" for c in cells if c)
    assert safe_cell("plain") == "plain"
    assert "=SUM(A1:A9)" in summary(rows)


@pytest.mark.parametrize(("out", "message"), [
    ("grades.txt", r"\.csv"), ("missing/grades.csv", "does not exist"),
    ("adir.csv", "directory"), ("subs/alice/x.csv", "inside the submissions"),
])
def test_out_is_refused_before_any_work(tmp_path: Path, out: str, message: str) -> None:
    (tmp_path / "adir.csv").mkdir()
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    with pytest.raises(ValueError, match=message):
        output_paths(tmp_path / out, tmp_path / "subs")
    code = main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / out)])
    assert code == 2 and not (tmp_path / "grades.csv").exists()


def test_check_leaves_the_cases_to_the_grader_in_a_graded_kernel(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(GRADING_ENV, "1")
    result = check("00.to_kib", lambda n: 1 / 0)
    assert (result.total, result.passed) == (0, 0)
    assert "grader runs this check itself" in capsys.readouterr().out
