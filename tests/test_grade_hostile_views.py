"""The grader's views under hostile input, with no kernel: folder names that must stay
apart, pages whose size is bounded whatever the rows hold, folder trees too deep to walk
recursively, shard CSVs and manifests that were tampered with or do not match, Windows
device names and very long names."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.grading import chapter_exercises, find_exercise, submissions
from course_lib.grading.check import CaseResult, observe
from course_lib.grading.execute import _remove
from course_lib.grading.feedback import MAX_NOTES, page_html, page_markdown, page_stem
from course_lib.grading.grade import GradeRow, judge_cases
from course_lib.grading.report import (
    Manifest,
    folder_digest,
    manifest_path,
    read_csv,
    summary,
    write_csv,
)
from course_lib.grading.submissions import find_submissions, printable, shown

NBSP_CHARACTER = "bob\u00a0smith".encode()  # valid UTF-8: NBSP is U+00A0, bytes C2 A0
NBSP_BYTE = b"bob\xa0smith"  # one raw byte 0xA0: not valid UTF-8
_ESCAPE = re.compile(rb"\\(\\|x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8}))")


def _nb() -> str:
    return json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _unshown(text: str) -> bytes:
    """The name's bytes back from its shown form: proof that no two names share one."""
    def back(match: re.Match[bytes]) -> bytes:
        escape, byte, short, long = match.groups()
        if escape == b"\\":
            return b"\\"
        if byte:
            return bytes([int(byte, 16)])
        return os.fsencode(chr(int(short or long, 16)))

    return _ESCAPE.sub(back, text.encode("utf-8"))


@given(st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_every_shown_name_reads_back_to_its_bytes(raw: bytes) -> None:
    text = shown(os.fsdecode(raw))
    assert text.isprintable() and _unshown(text) == raw


def test_a_character_and_a_byte_are_shown_apart() -> None:
    names = [NBSP_CHARACTER, NBSP_BYTE, rb"bob\xa0smith", rb"bob\u00a0smith"]
    assert len({shown(os.fsdecode(name)) for name in names}) == len(names)
    assert shown(os.fsdecode(NBSP_CHARACTER)) == "bob\\u00a0smith"
    assert shown(os.fsdecode(NBSP_BYTE)) == "bob\\xa0smith"
    assert printable("a\u00ad\x85\n\U000e0001") == "a\\u00ad\\u0085\\u000a\\U000e0001"


def test_two_folders_alike_but_for_a_byte_are_two_learners(tmp_path: Path) -> None:
    for name, notebook in ((NBSP_CHARACTER, "01_solved.ipynb"), (NBSP_BYTE, "01_other.ipynb")):
        folder = os.fsencode(tmp_path) + b"/" + name
        os.mkdir(folder)
        Path(os.fsdecode(folder + b"/" + notebook.encode())).write_text(_nb())
    inventory = find_submissions(tmp_path, ["01"])
    assert inventory.learners == ["bob\\xa0smith", "bob\\u00a0smith"] and not inventory.notes
    assert {sub.name for sub in inventory.graded.values()} == {"01_solved.ipynb",
                                                               "01_other.ipynb"}
    assert len({page_stem(name) for name in inventory.learners}) == 2


def test_folders_shown_alike_are_both_reported_and_neither_graded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("Bob", "bob", "carol"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "01_a.ipynb").write_text(_nb())
    monkeypatch.setattr(submissions, "shown", str.lower)  # a lossy form: Bob and bob meet
    inventory = find_submissions(tmp_path, ["01"])
    assert inventory.learners == ["carol"] and list(inventory.graded) == [("carol", "01")]
    assert [(n.name, n.status) for n in inventory.notes] == [("bob", "misnamed")] * 2
    assert "neither is graded" in inventory.notes[0].reason


def test_a_regrade_keeps_both_learners_whose_names_differ_by_a_byte(tmp_path: Path) -> None:
    """Whole run and ``--learners`` regrade (folders without notebooks: no kernel)."""
    subs = tmp_path / "subs"
    for name in (NBSP_CHARACTER, NBSP_BYTE, b"alice"):
        os.makedirs(os.fsencode(subs) + b"/" + name)
    out, book = tmp_path / "g.csv", tmp_path / "book.csv"
    common = ["--out", str(out), "--seed", "3", "--chapters", "01", "--no-sandbox",
              "--jobs", "1", "--gradebook", str(book)]
    assert main(["grade", str(subs), *common]) == 0
    before = out.read_text()
    assert main(["grade", str(subs), *common, "--learners", "bob\\xa0smith"]) == 0
    assert out.read_text() == before
    learners = [row.learner for row in read_csv(out)]
    exercises = len(chapter_exercises("01"))
    assert [learners.count(n) for n in ("alice", "bob\\xa0smith", "bob\\u00a0smith")] == [
        exercises] * 3
    assert json.loads(manifest_path(out).read_text())["learners"] == [
        "alice", "bob\\u00a0smith", "bob\\xa0smith"]
    assert len(book.read_text().splitlines()) == 4


HUGE = "<&\"`*" * 1_000  # far past every cut, of what escaping lengthens most


def _hostile_rows(learner: str, notes: int) -> list[GradeRow]:
    failure = CaseResult(HUGE, False, HUGE, HUGE, HUGE, HUGE)
    rows = [GradeRow(learner, "01", HUGE, e.name, 0.5, "failed", HUGE, "", 1, 5, 1, 2,
                     failure, HUGE) for e in chapter_exercises("01")]
    rows.append(GradeRow(learner, "01", HUGE, "01.x", 0.0, "timed out", HUGE))
    rows += [GradeRow(learner, "", f"{i}{HUGE[:1000]}", "", 0.0, "misnamed", HUGE[:1000])
             for i in range(notes)]
    return rows


def test_a_page_stays_small_whatever_its_rows_hold() -> None:
    """Each exercise row adds at most 30,000 characters, the page around them 20,000, the
    files not graded at most :data:`MAX_NOTES` entries of 4,000, however large the rows."""
    rows = _hostile_rows(HUGE[:255], 1500)
    exercises = sum(1 for row in rows if row.exercise)
    bound = 20_000 + 30_000 * exercises + 4_000 * MAX_NOTES
    for page in (page_html(HUGE[:255], rows, 1), page_markdown(HUGE[:255], rows, 1)):
        assert len(page) < bound < 400_000
        assert "and 1480 more files not graded" in page and "\u2026" in page
        assert "&lt;&amp;" in page or "\\<\\&" in page


def test_a_forged_huge_observation_is_malformed() -> None:
    exercise = find_exercise("01.blocks_needed")
    cases = list(exercise.cases())
    observations = [observe(case, lambda tokens, block_size: -(-tokens // block_size))
                    for case in cases]
    for forged in ({"not_plain": "<" * 2001, "shown": "x"},
                   {"raised": ["E" * 2001], "shown": "x"}, {"value": 1, "shown": "x" * 2001}):
        text = json.dumps({"calls": [c.call for c in cases],
                           "observations": [forged, *observations[1:]]})
        assert judge_cases(text, cases).status == "invalid result"
    text = json.dumps({"calls": [c.call for c in cases],
                       "observations": [{"not_plain": "<" * 2000, "shown": "x"},
                                        *observations[1:]]})
    assert judge_cases(text, cases).status == "failed"


def test_a_folder_tree_too_deep_to_recurse_is_a_note(tmp_path: Path) -> None:
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "01_a.ipynb").write_text(_nb())
    (tmp_path / "mallory").mkdir()
    fd = os.open(tmp_path / "mallory", os.O_RDONLY)
    for _ in range(1200):  # deeper than Python 3.11's os.walk can recurse
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(os.open("01_x.ipynb", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    (tmp_path / "mallory" / "e").symlink_to(tmp_path / "alice")  # never followed
    (tmp_path / "mallory" / "f").mkdir()
    (tmp_path / "mallory" / "f" / "01_y.ipynb").write_text(_nb())
    try:
        inventory = find_submissions(tmp_path, ["01"])
    finally:  # pytest's own clean-up of old temporary folders recurses: leave it no deep tree
        _remove(tmp_path / "mallory")
    assert inventory.learners == ["alice", "mallory"]
    assert list(inventory.graded) == [("alice", "01")]
    notes = {(n.learner, n.name, n.status) for n in inventory.notes}
    assert notes == {("mallory", "f/01_y.ipynb", "misnamed"),
                     ("mallory", "/".join(["d"] * (submissions.MAX_DEPTH + 1)), "misnamed")}
    assert any("folders deep: not searched" in n.reason for n in inventory.notes)


# Shards made by hand: two learners of chapter 01, alice in shard 1/2, bob in 2/2.
CHAPTER = "01"
EVERYONE = ["alice", "bob"]


def _shard(folder: Path, k: int, graded: list[str], **manifest: object) -> Path:
    """Shard ``k`` of 2 holding the rows of ``graded``; ``manifest`` changes its manifest."""
    rows = [GradeRow(learner, CHAPTER, "", e.name, 0.0, "not submitted", "no 01 handed in")
            for learner in graded for e in chapter_exercises(CHAPTER)]
    if k == 1:
        rows.append(GradeRow("", "", "loose.ipynb", "", 0.0, "misnamed", "loose"))
    path = folder / f"part{k}.csv"
    write_csv(rows, path)
    fields = {"seed": 5, "memory": "a cgroup of 12288 MB", "chapters": [CHAPTER],
              "shard": f"{k}/2", "sandbox": True, "learners": graded, "folder_learners": 2,
              "folder_digest": folder_digest(EVERYONE), "timeout": 300.0, "memory_mb": 12288,
              **manifest}
    Manifest(**fields).write(manifest_path(path))
    return path


def _edit(path: Path, change: object) -> None:
    table = list(csv.reader(path.open(newline="")))
    table = change(table)
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(table)


def _score(value: str) -> object:
    return lambda t: [t[0], [*t[1][:4], value, *t[1][5:]], *t[2:]]


@pytest.mark.parametrize(("change", "manifest", "message"), [
    *((_score(value), {}, f"score {value!r}")
      for value in ("nan", "inf", "1e309", "7.000", "0.0005", "-0.000", "1.001", "0.5")),
    (lambda t: [*t, t[1]], {}, "more than once"),
    (lambda t: [*t, [*t[1][:4], "1.000", "passed", "", ""]], {}, "more than once"),
    (lambda t: [t[0], *(r for r in t[1:] if r[0] != "alice")], {}, "lacks 5 rows"),
    (lambda t: [*t, ["bob", *t[1][1:]]], {}, "'bob', who is not a learner"),
    (lambda t: [*t, ["bob", "", "evil.ipynb", "", "0.000", "misnamed", "x", ""]], {},
     "'bob', who is not a learner"),
    (lambda t: [*t, ["alice", "99", "x.ipynb", "99.fake", "1.000", "passed", "", ""]], {},
     "'99.fake'"),
    (lambda t: [*t, ["alice", "01", "x.ipynb", "01.fake", "1.000", "passed", "", ""]], {},
     "'01.fake'"),
    (lambda t: t, {"memory": "no cgroup"}, "memory bounds"),
    (lambda t: t, {"timeout": 60.0}, "timeouts"),
    (lambda t: t, {"chapters": ["01", "02"]}, "chapters"),
    (lambda t: t, {"learners": ["alice", "bob"]}, "learners"),
])
def test_merge_refuses_a_tampered_or_mismatched_shard_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object,
        manifest: dict[str, object], message: str) -> None:
    first = _shard(tmp_path, 1, ["alice"], **manifest)
    second = _shard(tmp_path, 2, ["bob"])
    _edit(first, change)
    code = main(["grade-merge", str(tmp_path / "m.csv"), str(first), str(second),
                 "--gradebook", str(tmp_path / "book.csv")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "part1" in err or "part2" in err
    assert not (tmp_path / "m.csv").exists() and not (tmp_path / "book.csv").exists()


def test_merge_of_untampered_hand_made_shards_succeeds(tmp_path: Path) -> None:
    parts = [_shard(tmp_path, 1, ["alice"]), _shard(tmp_path, 2, ["bob"])]
    assert main(["grade-merge", str(tmp_path / "m.csv"), *map(str, parts)]) == 0
    rows = read_csv(tmp_path / "m.csv")
    assert len(rows) == 2 * len(chapter_exercises(CHAPTER)) + 1
    merged = json.loads(manifest_path(tmp_path / "m.csv").read_text())
    assert (merged["timeout"], merged["memory_mb"]) == (300.0, 12288)


@pytest.mark.parametrize(("change", "flags", "message"), [
    (_score("nan"), [], "score 'nan'"),
    (lambda t: [*t, t[1]], [], "more than once"),
    (lambda t: t, ["--timeout", "60"], "--timeout 60 differs"),
    (lambda t: t, ["--memory-mb", "2048"], "--memory-mb 2048 differs"),
])
def test_a_regrade_refuses_a_tampered_csv_or_other_limits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object,
        flags: list[str], message: str) -> None:
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    (tmp_path / "subs" / "bob").mkdir()
    path = _shard(tmp_path, 1, EVERYONE, shard=None)
    _edit(path, change)
    before = path.read_bytes()
    code = main(["grade", str(tmp_path / "subs"), "--out", str(path), "--learners", "bob",
                 "--seed", "5", "--no-sandbox", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert path.read_bytes() == before


def test_windows_device_names_get_the_digest_form() -> None:
    for name in ("con", "nul", "aux", "prn", "com1", "lpt9", "nul.txt", "con.tar.gz"):
        assert "~" in page_stem(name), name
    for name in ("console", "com10", "lpt", "nullable", "auxiliary.md"):
        assert page_stem(name) == name


def test_a_long_name_does_not_widen_every_line_of_the_summary() -> None:
    rows = [GradeRow(name, "01", "n", "01.x", 1.0, "passed") for name in ("x" * 255, "bob")]
    lines = summary(rows, 1).splitlines()
    assert max(len(line) for line in lines if "x" * 255 not in line) < 70
    assert any(line.startswith("  " + "x" * 255 + "  ") for line in lines)
