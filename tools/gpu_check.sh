#!/usr/bin/env bash
# The course on a CUDA GPU (issue 15): kernel and engine tests with fp16/bf16, both benchmarks
# and chapters 06-07 executed, everything written to one folder.
#
#   bash tools/gpu_check.sh OUTDIR            # GPU machine: under 10 minutes on one H200
#   bash tools/gpu_check.sh --smoke OUTDIR    # reduced run on a CPU (Triton interpreter), ~1 min
#
# How the lead runs it with the device tool (one H200, no internet, 15 min of device time).
# Only 8 files come back from $OUT, so the folder travels back as one tarball:
#   1. here:    bash tools/fetch_gpu_wheels.sh    (.whl/: nbclient, ipykernel and deps, ~10 MB)
#   2. device:  run(carry=[".whl"], timeout_s=600, command=
#                 "bash tools/gpu_check.sh /tmp/gpu; rc=$?; tar czf $OUT/gpu.tar.gz -C /tmp gpu;
#                  cp /tmp/gpu/summary.txt $OUT/; exit $rc")
#               The summary lines also print to stdout, so output_tail shows them even if the
#               call is cut off.
#   3. here:    mkdir -p results && tar xzf FILES_AT/gpu.tar.gz -C results  (-> results/gpu/),
#               commit results/gpu/. Notebook 06 plots course_lib/attention/results/h200.csv
#               when it exists: copy results/gpu/attention_bench/bench.csv there and
#               re-execute the notebook (not done yet: no GPU run so far).
# The device has no internet: Hugging Face runs offline (HF_HUB_OFFLINE=1), so a cell that
# downloads a model fails at once instead of waiting on the network.
#
# OUTDIR receives: env.txt (GPU, driver, torch/triton/CUDA versions); tests.xml + tests.log
# (pytest tests/test_attention.py tests/test_engine.py, and chapter 10's
# tests/test_attention_fp8.py tests/test_attention_mla.py tests/test_engine_fp8.py);
# attention_bench/bench.csv, bench.png + attention_bench.log; fp8_decode_bench.csv + .log
# (FP8 vs fp16/bf16 paged decode, GPU only: --smoke writes only the log, saying why);
# engine_bench.log; notebooks/06_*.ipynb, 07_*.ipynb (executed copies) + notebooks.log; summary.txt, one line per part: "NAME: pass|fail|skip, SECONDS s, FIGURE".
# Each part runs under its own time budget and a failing part does not stop the next; the
# exit status is 1 if any part failed. PYTHON chooses the interpreter (default python3). When
# nbclient or ipykernel does not import, the wheels in .whl/ are installed to /tmp/site.
set -uo pipefail

smoke=0
if [[ ${1:-} == --smoke ]]; then
    smoke=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: bash tools/gpu_check.sh [--smoke] OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-python3}

# Scratch (caches of matplotlib, Jupyter, IPython, Triton) stays out of $HOME and the repo.
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
export MPLCONFIGDIR=$work/mpl IPYTHONDIR=$work/ipython JUPYTER_CONFIG_DIR=$work/jupyter
export JUPYTER_DATA_DIR=$work/jupyter JUPYTER_RUNTIME_DIR=$work/jupyter/runtime
export TRITON_CACHE_DIR=$work/triton XDG_CACHE_HOME=$work/cache HF_HUB_OFFLINE=1
export JUPYTER_PLATFORM_DIRS=1 PYDEVD_DISABLE_FILE_VALIDATION=1

if ((smoke)); then
    export HF_HOME=$work/hf
    budget=(env 60 tests 150 attention_bench 90 engine_bench 90 notebooks 150)
    test_args=(-k "test_canary_passes or split1-fp32 or contiguous_logits")
    attention_args=(--smoke --batches 2)
    engine_args=(--smoke --threads 1)
    notebooks=(notebooks/06_triton_paged_attention.ipynb)
else
    budget=(env 20 tests 190 attention_bench 115 fp8_decode_bench 60 engine_bench 80
            notebooks 105)  # 570 s
    test_args=()
    if "$python" -c "import xdist" 2>/dev/null; then  # Triton compiles on 8 cores at once
        test_args=(-n 8)
    fi
    attention_args=(--warmup-ms 10 --rep-ms 30)  # every case of the sweep, shorter timing
    engine_args=(--requests 48)  # the GPU setup's sweeps on 48 of its 256 requests
    notebooks=(notebooks/06_triton_paged_attention.ipynb notebooks/07_capstone_serving_engine.ipynb)
fi
declare -A seconds_for
for ((i = 0; i < ${#budget[@]}; i += 2)); do
    seconds_for[${budget[i]}]=${budget[i + 1]}
done

: >"$out/summary.txt"
failed=0

# Run one part: `part NAME COMMAND...` logs to OUTDIR/NAME.log under NAME's time budget,
# then appends its summary line (the key figure comes from `figure NAME`).
part() {
    local name=$1 start=$SECONDS rc status log figure
    shift
    log=$(log_of "$name")
    if declare -F "$1" >/dev/null; then  # a function of this script: run it in a child bash
        set -- bash -c '"$@"' "$1" "$@"
    fi
    timeout --signal=INT --kill-after=10 "${seconds_for[$name]}" "$@" >"$log" 2>&1
    rc=$?
    status=pass
    if ((rc == 124)); then
        status=fail
        echo "timed out after ${seconds_for[$name]} s" >>"$log"
    elif ((rc != 0)); then
        status=fail
    fi
    [[ $status == fail ]] && failed=1
    figure=$(figure "$name" "$rc")
    record "$name" "$status" $((SECONDS - start)) "${figure:-exit status $rc}"
}

log_of() {  # where a part's output goes: the environment part's is the environment file
    if [[ $1 == env ]]; then echo "$out/env.txt"; else echo "$out/$1.log"; fi
}

record() {  # NAME STATUS SECONDS FIGURE
    printf '%s: %s, %d s, %s\n' "$@" | tee -a "$out/summary.txt"
}

# The key figure of a part, read from what it wrote.
figure() {
    "$python" - "$out" "$1" "$2" "$(log_of "$1")" <<'EOF'
import csv, math, re, statistics, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, name, rc, log = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
log = log.read_text(errors="replace") if log.exists() else ""
if rc == 124:
    print("timed out;", end=" ")
if name == "env":
    line = next((l for l in log.splitlines() if l.startswith("device:")), "device: unknown")
    print(line.removeprefix("device: "))
elif name == "tests":
    try:
        suite = ET.parse(out / "tests.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        print(f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, "
              f"{n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
    except (OSError, ET.ParseError, AttributeError):
        print("no junit XML")
elif name == "attention_bench":
    path = out / "attention_bench" / "bench.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    done = [r for r in rows if not math.isnan(float(r["paged_ms"]))]
    if not done:
        print(f"{len(rows)} cases, none measured")
        sys.exit()
    cost = statistics.median(float(r["paging_cost"]) for r in done)
    shares = [float(r["peak_share"]) for r in done if not math.isnan(float(r["peak_share"]))]
    share = f"{max(shares):.0%}" if shares else "n/a"
    err = max(float(r["max_abs_err"]) for r in done)
    print(f"{len(done)}/{len(rows)} cases measured, median paging cost {cost:+.1%}, "
          f"best share of peak {share}, max abs err {err:.1e}")
elif name == "fp8_decode_bench":
    path = out / "fp8_decode_bench.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    fp8 = [r for r in rows if r["kv_dtype"] == "float8_e4m3fn"]
    if not fp8:
        print("no FP8 rows")
        sys.exit()
    ups = sorted(float(r["speedup_vs_fp16"]) for r in fp8)
    gbps = max(float(r["gbps"]) for r in fp8)
    err = max(float(r["max_abs_err_vs_fp16"]) for r in fp8)
    print(f"{len(fp8)} shapes, FP8/fp16 speed-up {ups[0]:.2f}x-{ups[-1]:.2f}x (median "
          f"{statistics.median(ups):.2f}x), FP8 up to {gbps:.0f} GB/s of KV, max abs err "
          f"vs fp16 {err:.1e}")
elif name == "engine_bench":
    ratios = {}
    for line in log.splitlines():
        words = line.split()
        if words and words[0] in ("budget", "batch") and words[-1].endswith("x"):
            ratios.setdefault(words[0], []).append(words[-1])
    print("; ".join(f"{k} sweep paged/contiguous {' '.join(v)}" for k, v in ratios.items())
          or "no results")
elif name == "notebooks":
    done = re.findall(r"^executed (\S+) in \S+ s, (\d+) stderr outputs$", log, re.M)
    failed = re.findall(r"^FAILED (\S+)", log, re.M)
    stderr = sum(int(n) for _, n in done)
    print(f"{len(done)} executed, {len(failed)} failed, {stderr} stderr outputs")
EOF
}

environment() {
    "$python" - <<'EOF'
import platform
import torch
import course_lib.attention as attention
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "not installed"
cuda = torch.cuda.is_available()
print(f"device: {torch.cuda.get_device_name() if cuda else 'CPU (no CUDA device)'}")
print(f"python: {platform.python_version()}")
print(f"torch: {torch.__version__}")
print(f"torch CUDA: {torch.version.cuda}")
print(f"triton: {triton_version}")
print(attention.describe_kernel_mode())
if cuda:
    props = torch.cuda.get_device_properties(0)
    print(f"compute capability: {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.0f} GiB")
EOF
    local rc=$?
    echo "git commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        nvidia-smi
    else
        echo "nvidia-smi: not found"
    fi
    return $rc
}

# Make nbclient and ipykernel importable, from .whl/ if needed; prints the PYTHONPATH to use.
notebook_path() {
    local site=/tmp/site
    if "$python" -c "import nbclient, ipykernel" 2>/dev/null; then
        echo "$PYTHONPATH"
        return 0
    fi
    compgen -G ".whl/*.whl" >/dev/null || return 1
    if "$python" -m pip --version >/dev/null 2>&1; then
        "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$site" .whl/*.whl >&2
    else  # a wheel is a zip laid out for site-packages
        for wheel in .whl/*.whl; do "$python" -m zipfile -e "$wheel" "$site" || return 1; done
    fi
    PYTHONPATH="$site:$PYTHONPATH" "$python" -c "import nbclient, ipykernel" >&2 || return 1
    echo "$site:$PYTHONPATH"
}

execute_notebooks() {  # NOTEBOOK... -> OUTDIR/notebooks/, one "executed"/"FAILED" line each
    mkdir -p "$out/notebooks"
    "$python" - "$out/notebooks" "$@" <<'EOF'
import re, sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
target, failed = Path(sys.argv[1]), 0
for source in map(Path, sys.argv[2:]):
    nb = nbformat.read(source, as_version=4)
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(source.parent)}}).execute()
    except (CellExecutionError, TimeoutError, RuntimeError) as error:
        failed += 1
        print(f"FAILED {source.name}:", re.sub(r"\x1b\[[0-9;]*m", "", str(error))[-3000:])
        continue
    finally:
        nbformat.write(nb, target / source.name)
    stderr = sum(o.get("name") == "stderr" for c in nb.cells for o in c.get("outputs", []))
    print(f"executed {source.name} in {time.perf_counter() - start:.0f} s, {stderr} stderr outputs")
sys.exit(1 if failed else 0)
EOF
}

export -f environment execute_notebooks
export python out
part env environment
part tests "$python" -m pytest tests/test_attention.py tests/test_engine.py \
    tests/test_attention_fp8.py tests/test_attention_mla.py tests/test_engine_fp8.py -p no:cacheprovider \
    -q -rs --junitxml="$out/tests.xml" "${test_args[@]}"
part attention_bench "$python" -m course_lib.attention.bench --out "$out/attention_bench" \
    "${attention_args[@]}"
if ((smoke)); then  # no summary line: the smoke run's parts are the CPU-runnable ones
    echo "skip: GPU only, the Triton interpreter's times say nothing of bandwidth" |
        tee "$out/fp8_decode_bench.log"
else
    part fp8_decode_bench "$python" -m course_lib.attention.quantized_bench \
        --out "$out/fp8_decode_bench.csv"
fi
part engine_bench "$python" -m course_lib.engine.bench "${engine_args[@]}"
nb_path=$(notebook_path 2>"$out/wheels.log")
nb_ready=$?
[[ -s $out/wheels.log ]] || rm -f "$out/wheels.log"
if ((nb_ready == 0)); then
    export PYTHONPATH=$nb_path
    part notebooks execute_notebooks "${notebooks[@]}"
elif ((smoke)); then
    record notebooks skip 0 "nbclient/ipykernel not importable, none installed from .whl/"
else
    failed=1
    why="nbclient/ipykernel not importable, none installed from .whl/"
    record notebooks fail 0 "$why (run tools/fetch_gpu_wheels.sh first)"
fi
exit $failed
