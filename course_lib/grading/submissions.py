r"""What a class handed in: ``SUBMISSIONS/<learner>/NN_name.ipynb``, read once into memory.

Every file a learner left is accounted for: one notebook per graded chapter is graded; a
second one for the same chapter is a ``duplicate``; a notebook whose name has no graded
chapter, or that sits in a sub-folder, is ``misnamed``. Folder and file names are shown
escaped and told apart (:func:`shown`): a byte that is not valid UTF-8 as ``\xNN``, a
character that is not printable (newlines, terminal escapes, NBSP) as ``\uNNNN`` or
``\UNNNNNNNN``, a backslash doubled. Two folders shown alike are graded as neither. A
learner's folder is searched without recursion or links, at most :data:`MAX_DEPTH` folders
deep. Every file is read with a size limit, and contents are read before any learner code
runs, so what is graded cannot be changed by another submission.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.grading import GRADED_CHAPTERS

MAX_NOTEBOOK_BYTES = 50 << 20
MAX_DEPTH = 4
"""Deepest sub-folder of a learner's folder searched for notebooks (notebooks belong in the
folder itself; one found deeper is reported ``misnamed``, a folder deeper still is not
searched)."""
_CHAPTER = re.compile(r"^(\d\d)_.*\.ipynb$")


@dataclass(frozen=True)
class Submission:
    """One notebook handed in for a chapter: who, which file, and its bytes (or a problem)."""

    learner: str
    chapter: str
    name: str
    data: bytes
    problem: str = ""


@dataclass(frozen=True)
class FileNote:
    """A file that is not graded, with why: ``misnamed`` or ``duplicate``."""

    learner: str
    name: str
    status: str
    reason: str


@dataclass
class Inventory:
    """The class: learners in order, the graded notebook per (learner, chapter), notes."""

    learners: list[str] = field(default_factory=list)
    graded: dict[tuple[str, str], Submission] = field(default_factory=dict)
    notes: list[FileNote] = field(default_factory=list)


def printable(text: str) -> str:
    """``text`` as one line of printable text: each character that is not printable
    (newlines, terminal escapes, NBSP, lone surrogates) escaped as ``\\uNNNN`` or
    ``\\UNNNNNNNN``, never as ``\\xNN``, which :func:`shown` keeps for raw bytes."""
    return "".join(c if c.isprintable() else
                   f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in text)


def shown(name: str) -> str:
    """A file-system name as one line of printable text, told apart from every other name:
    backslashes doubled, then bytes that are not valid UTF-8 escaped as ``\\xNN`` and
    unprintable characters as ``\\uNNNN`` (:func:`printable`), so every escape reads back
    one way."""
    raw = os.fsencode(name)
    text = raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return printable(text)


def _notebooks(folder: Path) -> tuple[list[Path], list[Path]]:
    """Every ``*.ipynb`` under ``folder`` at most :data:`MAX_DEPTH` folders down, sorted, and
    the folders too deep to search. Iterative and never through a link, so no tree stops
    the class; hidden folders (checkpoints) are skipped, unreadable ones are as if empty."""
    found, deep, todo = [], [], [(folder, 0)]
    while todo:
        here, depth = todo.pop()
        try:
            with os.scandir(here) as entries:
                listed = list(entries)
        except OSError:
            continue
        for entry in listed:
            path = here / entry.name
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                if depth < MAX_DEPTH:
                    todo.append((path, depth + 1))
                else:
                    deep.append(path)
            elif entry.name.endswith(".ipynb"):
                found.append(path)
    return sorted(found, key=_byte_order), sorted(deep, key=_byte_order)


def _byte_order(path: Path) -> bytes:
    """The key that sorts paths the same on every machine: their bytes."""
    return os.fsencode(str(path))


def _read(path: Path) -> tuple[bytes, str]:
    """The file's bytes (at most the limit's worth are ever read), or a problem that makes
    it ``not a notebook``."""
    if path.is_symlink() or not path.is_file():
        return b"", "not a regular file"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_NOTEBOOK_BYTES + 1)
    except OSError as error:
        return b"", f"unreadable ({error.strerror})"
    if len(data) > MAX_NOTEBOOK_BYTES:
        return b"", f"larger than {MAX_NOTEBOOK_BYTES >> 20} MB"
    return data, ""


def find_submissions(folder: Path, chapters: Sequence[str] | None = None) -> Inventory:
    """Read every learner's notebooks under ``folder`` (which must exist) for ``chapters``
    (default: every graded chapter)."""
    folder = Path(folder)
    chapters = tuple(chapters or GRADED_CHAPTERS)
    if not folder.is_dir():
        raise ValueError(f"submissions folder {str(folder)!r} does not exist")
    inventory = Inventory()
    entries = sorted(folder.iterdir(), key=_byte_order)
    alike = Counter(shown(entry.name) for entry in entries)
    for entry in entries:
        name = shown(entry.name)
        if alike[name] > 1:
            inventory.notes.append(FileNote(name, name, "misnamed",
                                            f"{name} is shown like another entry's name, so "
                                            "neither is graded: rename one of them"))
        elif entry.is_symlink():
            inventory.notes.append(FileNote(name, name, "misnamed",
                                            f"{name} is a link, not a learner's folder"))
        elif entry.is_dir() and entry.name.startswith("."):
            if _notebooks(entry)[0]:
                inventory.notes.append(FileNote(name, name, "misnamed",
                                                f"{name} is hidden: rename it to grade it"))
        elif entry.is_dir():
            _learner(entry, name, chapters, inventory)
        elif entry.name.endswith(".ipynb"):
            inventory.notes.append(FileNote("", name, "misnamed",
                                            f"{name} is not in a learner's folder"))
    return inventory


def _learner(folder: Path, learner: str, chapters: tuple[str, ...],
             inventory: Inventory) -> None:
    """Add one learner's graded notebooks and notes to ``inventory``."""
    inventory.learners.append(learner)
    found, deep = _notebooks(folder)
    for path in found:
        name = shown(str(path.relative_to(folder)))
        match = _CHAPTER.match(path.name)
        if path.parent != folder:
            reason = f"{name} is in a sub-folder: put it directly in the learner's folder"
        elif not match:
            reason = f"{name} does not start with a chapter number such as 01_"
        elif match.group(1) not in chapters:
            reason = f"{name}: chapter {match.group(1)} has no graded exercises"
        elif (learner, match.group(1)) in inventory.graded:
            first = inventory.graded[learner, match.group(1)].name
            inventory.notes.append(FileNote(learner, name, "duplicate",
                                            f"a second notebook for chapter {match.group(1)}; "
                                            f"{first} is graded"))
            continue
        else:
            data, problem = _read(path)
            inventory.graded[learner, match.group(1)] = Submission(
                learner, match.group(1), name, data, problem)
            continue
        inventory.notes.append(FileNote(learner, name, "misnamed", reason))
    if deep:
        name = shown(str(deep[0].relative_to(folder)))
        more = f" (and {len(deep) - 1} more)" if len(deep) > 1 else ""
        inventory.notes.append(FileNote(learner, name, "misnamed",
                                        f"{name}{more} is more than {MAX_DEPTH} folders deep: "
                                        "not searched; put notebooks directly in the "
                                        "learner's folder"))
