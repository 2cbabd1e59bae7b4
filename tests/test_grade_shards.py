"""Grading a class in shards: N shards run as separate processes with one seed, merged,
give the rows (byte for byte), summary, gradebook and feedback pages of one run over the
whole class; a regrade of some learners leaves every other row as it was; missing,
duplicated and mismatched shards are refused, naming them; the cluster recipes are
well-formed; the speed benchmark runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from course_lib.grading.feedback import page_stem
from course_lib.grading.grade import shard_learners

ROOT = Path(__file__).resolve().parent.parent
CH01 = "01_kv_cache_arithmetic.ipynb"
SEED = 1234
LEARNERS = ("alice", "bob", "carol <b>&amp;", "dave")


def _buggy(path: Path) -> None:
    """Chapter 01 solved with two slips: K and V not both counted, blocks rounded down."""
    notebook = nbformat.read(ROOT / "solutions" / CH01, as_version=4)
    for cell in notebook.cells:
        cell.source = (cell.source
                       .replace("return 2 * layers * kv_heads", "return layers * kv_heads")
                       .replace("return -(-tokens // block_size)", "return tokens // block_size"))
    nbformat.write(notebook, path)


def _class(folder: Path) -> Path:
    """Four learners: chapter 01 solved, unsolved, with slips, not handed in; a stray file."""
    subs = folder / "SUBMISSIONS"
    for learner in LEARNERS:
        (subs / learner).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / CH01, subs / "alice" / CH01)
    shutil.copy(ROOT / "exercises" / CH01, subs / "bob" / CH01)
    _buggy(subs / LEARNERS[2] / CH01)
    (subs / "dave" / "notes.ipynb").write_text("{}")
    (subs / "loose.ipynb").write_text("{}")
    return subs


def _grade(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "course_lib", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(process: subprocess.Popen, status: int = 0) -> str:
    out, err = process.communicate(timeout=900)
    assert process.returncode == status, err[-3000:]
    return out + err


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The class graded once whole and once as 3 shards (separate processes), merged."""
    work = tmp_path_factory.mktemp("shards")
    subs = _class(work)
    common = ["--seed", str(SEED), "--jobs", "1", "--timeout", "240"]
    runs = [_grade("grade", str(subs), "--out", "whole.csv", "--gradebook", "whole-book.csv",
                   "--feedback", "whole-pages", *common, cwd=work)]
    runs += [_grade("grade", str(subs), "--out", f"part{k}.csv", "--shard", f"{k}/3",
                    "--feedback", f"pages{k}", "--gradebook", f"book{k}.csv", *common, cwd=work)
             for k in (1, 2, 3)]
    for run in runs:
        _done(run)
    _done(_grade("grade-merge", "merged.csv", "part3.csv", "part1.csv", "part2.csv",
                 "--gradebook", "merged-book.csv", "--feedback", "merged-pages", cwd=work))
    return work


def test_shards_merged_are_the_whole_run_byte_for_byte(graded: Path) -> None:
    for whole, merged in (("whole.csv", "merged.csv"), ("whole.txt", "merged.txt"),
                          ("whole-book.csv", "merged-book.csv")):
        assert (graded / whole).read_bytes() == (graded / merged).read_bytes(), whole
    pages = sorted(p.name for p in (graded / "whole-pages").iterdir())
    assert pages == sorted(p.name for p in (graded / "merged-pages").iterdir())
    assert pages == sorted(page_stem(n) + s for n in LEARNERS for s in (".html", ".md"))
    for name in pages:
        assert (graded / "whole-pages" / name).read_bytes() == (
            graded / "merged-pages" / name).read_bytes()
    text = (graded / "whole.csv").read_text()
    assert "loose.ipynb" in text and "notes.ipynb" in text and "<b>&amp;" in text
    # each shard holds its learners' rows only; the stray file goes with shard 1
    assert [shard_learners(LEARNERS, (k, 3)) for k in (1, 2, 3)] == [
        ["alice", "dave"], ["bob"], [LEARNERS[2]]]
    assert "loose.ipynb" in (graded / "part1.csv").read_text()
    assert "alice" not in (graded / "part2.csv").read_text()


def test_gradebook_is_exact_and_feedback_shows_fixed_failures_only(graded: Path) -> None:
    book = (graded / "whole-book.csv").read_text().splitlines()
    assert book[0] == "learner,chapter 01,total"
    assert book[1] == "alice,5.000,5.000" and book[2] == "bob,0.000,0.000"
    assert book[4] == "dave,0.000,0.000"
    page = (graded / "whole-pages" / (page_stem(LEARNERS[2]) + ".html")).read_text()
    assert "carol &lt;b&gt;&amp;amp;" in page and "<b>&amp;" not in page
    assert "01.bytes_per_token" in page and "01.blocks_needed" in page
    assert 'class="hint"' in page and "<script" not in page and "src=" not in page
    assert f"<code>{SEED}</code>" in page and "alice" not in page


def test_regrading_learners_leaves_every_other_row(graded: Path) -> None:
    work = graded / "regrade"
    shutil.copytree(graded / "SUBMISSIONS", work / "SUBMISSIONS")
    for name in ("whole.csv", "whole.txt", "whole.manifest.json", "whole-book.csv"):
        shutil.copy(graded / name, work / name)
    shutil.copytree(graded / "whole-pages", work / "whole-pages")
    (work / "SUBMISSIONS" / "bob" / CH01).unlink()
    shutil.copy(ROOT / "solutions" / CH01, work / "SUBMISSIONS" / "bob" / CH01)
    before = (work / "whole.csv").read_text().splitlines()
    out = _done(_grade("grade", "SUBMISSIONS", "--out", "whole.csv", "--learners", "bob",
                       "--seed", str(SEED), "--jobs", "1", cwd=work))
    assert "bob" in out
    after = (work / "whole.csv").read_text().splitlines()
    assert [line for line in before if not line.startswith("bob,")] == [
        line for line in after if not line.startswith("bob,")]
    assert {line.split(",")[5] for line in after if line.startswith("bob,")} == {"passed"}
    book = (work / "whole-book.csv").read_text().splitlines()
    assert book[2] == "bob,5.000,5.000" and book[1] == "alice,5.000,5.000"
    assert "passed" in (work / "whole-pages" / "bob.md").read_text()
    for name in ("alice.html", "dave.md"):
        assert (work / "whole-pages" / name).read_bytes() == (
            graded / "whole-pages" / name).read_bytes()
    refused = _done(_grade("grade", "SUBMISSIONS", "--out", "whole.csv", "--learners", "bob",
                           "--seed", "99", cwd=work), 2)
    assert "--seed 99" in refused and str(SEED) in refused
    refused = _done(_grade("grade", "SUBMISSIONS", "--out", "whole.csv", "--learners",
                           "bob,zed", "--seed", str(SEED), cwd=work), 2)
    assert "'zed'" in refused


@pytest.mark.parametrize(("parts", "message"), [
    (["part1.csv", "part2.csv"], "missing shard 3/3"),
    (["part1.csv", "part2.csv", "part3.csv", "part2.csv"], "duplicated shard 2/3"),
    (["part1.csv", "whole.csv"], "not a shard"),
])
def test_merge_refuses_missing_duplicated_and_foreign_parts(
        graded: Path, parts: list[str], message: str) -> None:
    out = _done(_grade("grade-merge", "bad.csv", *parts, cwd=graded), 2)
    assert message in out and not (graded / "bad.csv").exists()


def test_merge_refuses_shards_of_another_seed(graded: Path) -> None:
    import json

    other = graded / "other"
    other.mkdir(exist_ok=True)
    for k in (1, 2, 3):
        shutil.copy(graded / f"part{k}.csv", other / f"part{k}.csv")
        manifest = json.loads((graded / f"part{k}.manifest.json").read_text())
        manifest["seed"] = SEED + (k == 3)
        (other / f"part{k}.manifest.json").write_text(json.dumps(manifest))
    out = _done(_grade("grade-merge", "m.csv", "part1.csv", "part2.csv", "part3.csv",
                       cwd=other), 2)
    assert "seeds" in out and "part3.csv" in out


@pytest.mark.parametrize(("args", "flag"), [
    (["--shard", "1/3"], "--seed"), (["--shard", "4/3", "--seed", "1"], "--shard"),
    (["--shard", "0/3", "--seed", "1"], "--shard"), (["--shard", "x", "--seed", "1"], "--shard"),
    (["--learners", "a"], "--seed"),
    (["--shard", "1/2", "--learners", "a", "--seed", "1"], "--learners"),
])
def test_bad_shard_and_learner_flags_exit_2_naming_the_flag(
        tmp_path: Path, args: list[str], flag: str) -> None:
    (tmp_path / "subs").mkdir()
    out = _done(_grade("grade", "subs", "--out", "g.csv", *args, cwd=tmp_path), 2)
    assert flag in out and not (tmp_path / "g.csv").exists()


def test_slurm_recipe_is_a_job_array_of_shards_then_a_merge() -> None:
    script = ROOT / "recipes" / "grading" / "slurm-grade.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --array=0-" in text
    assert "--shard $((SLURM_ARRAY_TASK_ID + 1))/" in text and "--seed" in text
    assert "--dependency=afterok:" in text and "grade-merge" in text


def test_kubernetes_recipe_is_an_indexed_job_with_what_bwrap_needs() -> None:
    documents = [d for d in yaml.safe_load_all(
        (ROOT / "recipes" / "grading" / "kubernetes-grade.yaml").read_text()) if d]
    job = next(d for d in documents if d["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    command = " ".join(container["command"] + container.get("args", []))
    assert "JOB_COMPLETION_INDEX" in command and "--shard" in command and "--seed" in command
    assert str(spec["completions"]) in command
    security = container["securityContext"]
    assert security["seccompProfile"]["type"] == "Unconfined"
    assert security["appArmorProfile"]["type"] == "Unconfined"
    assert "cannot create the sandbox" in (ROOT / "recipes" / "grading" / "README.md").read_text()


def test_bench_grader_runs_on_one_learner(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_grader.py"), "--learners", "1",
         "--chapters", "01", "--jobs", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nbclient" in done.stdout and "ratio" in done.stdout
    assert "notebooks/min" in done.stdout
