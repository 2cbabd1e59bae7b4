"""The grader's parts that run no kernel: plain data, judging, static reading, inventory, CSV,
the answer key withheld from the sandbox's library, and the cases shipped into it."""

from __future__ import annotations

import asyncio
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
from course_lib.grading.grade import GradeRow, judge_cases
from course_lib.grading.grade import score as grade_score
from course_lib.grading.report import output_paths, safe_cell, summary, write_csv
from course_lib.grading.source import (
    MAX_CODE_CELLS,
    GradedCheck,
    NotANotebook,
    code_cells,
    graded_checks,
    parse_cells,
    python_of,
    read_isolated,
)
from course_lib.grading.submissions import MAX_NOTEBOOK_BYTES, find_submissions, shown

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
    assert to_plain(torch.zeros(1 << 22)) == [0.0] * (1 << 22)


def test_an_array_larger_than_any_answer_is_refused_before_it_is_copied() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    cache = torch.empty((1 << 22) + 1, dtype=torch.float8_e4m3fn)
    with pytest.raises(NotPlainData, match="4,194,305 numbers is larger than any answer"):
        to_plain({"cache": cache})
    with pytest.raises(NotPlainData, match="4,194,305 numbers"):
        to_plain(np.zeros((1 << 22) + 1))


def _cases(name: str) -> list:
    return list(find_exercise(name).cases())


def _harvest(name: str, fn: object) -> dict:
    cases = _cases(name)
    return {"calls": [c.call for c in cases],
            "observations": [observe(c, fn) for c in cases]}


def _kib(n: int) -> float:
    if n < 0:
        raise ValueError(n)
    return n / 1024


def test_judging_a_harvest_scores_in_this_process() -> None:
    cases = _cases("00.to_kib")
    passed = judge_cases(json.dumps(_harvest("00.to_kib", _kib)), cases)
    assert (passed.score, passed.status, passed.reason, passed.flag) == (1.0, "passed", "", "")
    failed = judge_cases(json.dumps(_harvest("00.to_kib", lambda n: float(n // 1024))), cases)
    assert (failed.score, failed.status, failed.flag) == (0.6, "failed", "")
    assert "3/5 fixed cases passed" in failed.reason


@given(st.lists(st.booleans(), min_size=1, max_size=8), st.lists(st.booleans(), max_size=8))
def test_only_fresh_cases_decide_a_score(fixed: list[bool], fresh: list[bool]) -> None:
    """Answers copied from check's reports pass the fixed cases only: they earn nothing, and
    failing a fixed case that a fresh one of its kind passes costs nothing either."""
    share, text = grade_score([*fixed, *fresh], len(fixed))
    assert f"{sum(fixed)}/{len(fixed)} fixed" in text
    if fresh:
        assert share == sum(fresh) / len(fresh)
        assert share == grade_score([True] * len(fixed) + fresh, len(fixed))[0]
        assert f"{sum(fresh)}/{len(fresh)} fresh" in text
    else:
        assert share == sum(fixed) / len(fixed)
    assert grade_score([True] * 5 + [False] * 3, 5)[0] == 0.0


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=10))
def test_refusals_count_only_beside_a_value_case_passed(cases: list[tuple[bool, bool]]) -> None:
    """(passed, expects an error) per fresh case: refusing everything earns nothing, while an
    answer that gets a value right keeps every refusal it passed."""
    passed, refusals = [p for p, _ in cases], [r for _, r in cases]
    share, _ = grade_score([True, *passed], 1, [False, *refusals])
    values = [p for p, r in cases if not r]
    if values and not any(values):
        assert share == 0.0
    else:
        assert share == sum(passed) / len(passed)


def test_a_notebook_that_only_raises_scores_nothing() -> None:
    cases = _cases("01.blocks_needed")
    refuse_all = judge_cases(json.dumps(_harvest("01.blocks_needed", _refuse)), cases)
    assert refuse_all.score == 0.0 and refuse_all.fixed_passed > 0


def _refuse(*args: object) -> object:
    raise ValueError("no")


@pytest.mark.parametrize("damage", [
    lambda p: p.pop("observations"),
    lambda p: p.update(calls=["fn(0)"]),
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
    found = judge_cases(json.dumps(payload), _cases("00.to_kib"))
    assert (found.score, found.status) == (0.0, "invalid result")
    assert judge_cases("{not json", _cases("00.to_kib")).score == 0


def _trees(*cells: str) -> list:
    return list(parse_cells(list(cells)))


def test_the_last_check_per_exercise_is_graded_and_magics_parse() -> None:
    trees = _trees("%matplotlib inline\nimport os", "def f(n): return 1",
                   'check("00.to_kib", f)', "def g(n): return 2", 'check("00.to_kib", g)',
                   "this is ( not python")
    assert graded_checks(trees, ["00.to_kib"])["00.to_kib"].expression == "g"
    assert graded_checks(trees, ["00.to_kib"])["00.to_kib"].cell == 4


def test_magics_are_read_in_one_pass_and_timed_checks_still_count() -> None:
    cell = "\n".join(["%time x = 1"] * 500 + ["!ls", "y = !ls", "%matplotlib inline",
                                               '%time check("00.to_kib", f)'])
    assert python_of(cell).splitlines()[-4:] == ["pass", "y = None", "pass",
                                                  'check("00.to_kib", f)']
    trees = _trees("def f(n): return 1", cell, "%%bash\necho check", "%%time\nz = 2")
    assert graded_checks(trees, ["00.to_kib"])["00.to_kib"].cell == 1
    assert trees[2] is not None and trees[3] is not None


def _notebook_bytes(cells: object) -> bytes:
    return json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5,
                       "metadata": {}}).encode()


@pytest.mark.parametrize(("cells", "message"), [
    ([{"cell_type": "code", "source": 5}], "source is not text"),
    ([{"cell_type": "code", "source": ["a", 3]}], "source is not text"),
    ([{"cell_type": "code", "source": "x = 1"}] * (MAX_CODE_CELLS + 1), "code cells"),
    (7, "no list of cells"),
])
def test_every_notebook_shape_is_refused_with_a_reason(cells: object, message: str) -> None:
    with pytest.raises(NotANotebook, match=message):
        code_cells(_notebook_bytes(cells))
    with pytest.raises(NotANotebook, match="not a valid notebook"):
        code_cells(b"[" * 100_000)
    assert code_cells(_notebook_bytes([{"cell_type": "code", "source": ["a", "b"]},
                                       {"cell_type": "markdown", "source": 1}])) == ["ab"]


def test_a_notebook_too_deep_to_read_is_read_apart_and_breaks_no_other() -> None:
    """The grader reads each notebook in a process of its own: CPython 3.11's parser can be
    left broken by a tree too deep for it (CPython issue 106905)."""
    def notebook(*cells: str) -> bytes:
        return _notebook_bytes([{"cell_type": "code", "source": c} for c in cells])

    deep = notebook("def f(n): return n", 'check("00.to_kib", ' + "1+" * 5000 + "1)",
                    "x = " + "(" * 3000 + "1" + ")" * 3000)
    assert asyncio.run(read_isolated(deep, ["00.to_kib"])).checks == {}
    fine = asyncio.run(read_isolated(notebook('check("00.to_kib", f)'), ["00.to_kib"]))
    assert fine.checks["00.to_kib"] == GradedCheck(0, "f") and fine.sources
    with pytest.raises(NotANotebook, match="not a valid notebook"):
        asyncio.run(read_isolated(b"{", ["00.to_kib"]))


def test_a_huge_cell_runs_but_is_not_searched() -> None:
    huge = "x = 1\n" * 100_000 + 'check("00.to_kib", f)'
    assert list(parse_cells([huge])) == [None]
    many = ["a = [" + "1," * 30_000 + "]"] * 40 + ['check("00.to_kib", f)']
    assert graded_checks(parse_cells(many), ["00.to_kib"]) == {}  # past the notebook's budget


@pytest.mark.parametrize(("cell", "expression"), [
    ('check("00.to_kib", f)', "f"), ('check("00.to_kib", obj=f)', "f"),
    ('check(name="00.to_kib", obj=g)', "g"), ('check("00.to_kib", f, obj=g)', None),
    ('check("00.to_kib")', None),
])
def test_checks_by_position_or_keyword_and_too_deep_to_read(cell: str,
                                                            expression: str | None) -> None:
    found = graded_checks(_trees(cell), ["00.to_kib"]).get("00.to_kib")
    assert (found and found.expression) == expression


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
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "01_a.ipynb").write_text(_nb())
    (tmp_path / ".git").mkdir()
    (tmp_path / "linked").symlink_to(alice)
    (tmp_path / "caf\\xe9").mkdir()  # spelled as the other one is shown: still another name
    inventory = find_submissions(tmp_path, ("01", "02"))
    assert inventory.learners == ["alice", "caf\\\\xe9", "caf\\xe9"]
    assert list(inventory.graded) == [("alice", "01")]
    notes = {(n.name, n.status) for n in inventory.notes}
    assert notes == {("01_b.ipynb", "duplicate"), ("notes.ipynb", "misnamed"),
                     ("99_extra.ipynb", "misnamed"), ("sub/02_x.ipynb", "misnamed"),
                     ("02_loose.ipynb", "misnamed"), (".hidden", "misnamed"),
                     ("linked", "misnamed")}


def test_a_sparse_giant_is_never_read_whole(tmp_path: Path) -> None:
    (tmp_path / "bob").mkdir()
    for name in ("01_huge.ipynb", "data.bin"):
        with (tmp_path / "bob" / name).open("wb") as handle:
            handle.truncate(8 << 30)  # 8 GiB, sparse: costs no disk
    inventory = find_submissions(tmp_path)
    assert inventory.graded["bob", "01"].problem == f"larger than {MAX_NOTEBOOK_BYTES >> 20} MB"


@given(st.text())
def test_shown_names_are_one_printable_line(name: str) -> None:
    text = shown(name.replace("\x00", "").replace("/", ""))
    assert text.isprintable() and "\n" not in text and "\x1b" not in text


def test_forged_names_cannot_add_lines_to_the_summary(tmp_path: Path) -> None:
    evil = "mallory\n  alice  35.00 / 35\x1b[2J"
    rows = [GradeRow(shown(evil), "01", "01_a.ipynb", "01.x", 0.0, "failed", "", "")]
    text = summary(rows, 7)
    assert len(text.splitlines()) == 5 and "\x1b" not in text
    write_csv(rows, tmp_path / "g.csv")
    assert len((tmp_path / "g.csv").read_text().splitlines()) == 2


def test_csv_cells_never_become_formulas(tmp_path: Path) -> None:
    rows = [GradeRow("=SUM(A1:A9)", "01", "+1.ipynb", "01.x", 1.0, "passed", "-oops", ""),
            GradeRow("@bob", "01", "01_a.ipynb", "01.x", 0.0, "failed", "\tx", "")]
    write_csv(rows, tmp_path / "g.csv")
    cells = [c for row in csv.reader((tmp_path / "g.csv").open()) for c in row]
    assert not any(c[:1] in "=+-@\t" for c in cells if c)
    assert safe_cell("plain") == "plain"
    assert "=SUM(A1:A9)" in summary(rows, 0)


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


def test_cleanup_removes_whatever_a_kernel_leaves_and_never_raises(tmp_path: Path) -> None:
    """A symlink out of the run folder, a tree deeper than recursion and longer than a path,
    a setuid file and a folder without its write bit: all gone, nothing outside touched."""
    from course_lib.grading.execute import _remove

    root, outside = tmp_path / "sandbox", tmp_path / "outside"
    (root / "run" / "locked").mkdir(parents=True)
    outside.mkdir()
    (outside / "classmate.ipynb").write_text("{}")
    (root / "run" / "link").symlink_to(outside)
    (root / "run" / "dangling").symlink_to("/nonexistent")
    (root / "run" / "locked" / "f").write_text("x")
    (root / "run" / "locked").chmod(0o500)
    fd = os.open(root / "run", os.O_RDONLY)
    for _ in range(1500):  # 1,500 levels of 50-character names: past 4,096-byte paths
        os.mkdir("d" * 50, dir_fd=fd)
        deeper = os.open("d" * 50, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(os.open("setuid", os.O_WRONLY | os.O_CREAT, 0o4755, dir_fd=fd))
    os.close(fd)
    _remove(root)
    assert not root.exists()
    assert (outside / "classmate.ipynb").read_text() == "{}"
