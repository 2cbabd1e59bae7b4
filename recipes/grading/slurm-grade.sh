#!/bin/bash
# Grade a class on a Slurm cluster: a job array of N shards, then one merge job that runs
# only after every shard succeeded. From the course's checkout, on a login node:
#
#   bash recipes/grading/slurm-grade.sh SUBMISSIONS/ RESULTS/
#
# submits this script as the array (task i grades shard i+1 of N) and the dependent merge,
# which writes RESULTS/grades.csv, grades.txt, gradebook.csv and feedback/ exactly as one
# `grade` over the whole class would. Every shard uses the same --seed (SEED, drawn here
# unless you set it). Keep SHARDS equal to the number of tasks in --array (0-7: 8 tasks).
# The compute nodes need unprivileged user namespaces for bubblewrap, as `grade` does
# anywhere (see recipes/grading/README.md).
#SBATCH --job-name=grade-shard
#SBATCH --array=0-7
#SBATCH --cpus-per-task=4
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH --output=grade-shard-%A_%a.log
set -euo pipefail
SHARDS=8

if [[ -z "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    # On the login node: submit the array, then the merge once all its tasks succeeded.
    if [[ $# -ne 2 ]]; then
        echo "usage: bash $0 SUBMISSIONS/ RESULTS/" >&2
        exit 2
    fi
    PYTHON=${PYTHON:-$PWD/.venv/bin/python}
    SUBMISSIONS=$(realpath "$1")
    mkdir -p "$2"
    RESULTS=$(realpath "$2")
    SEED=${SEED:-$("$PYTHON" -c 'import secrets; print(secrets.randbelow(2**31))')}
    export PYTHON SUBMISSIONS RESULTS SEED
    array=$(sbatch --parsable --export=ALL --chdir="$PWD" "$0")
    sbatch --parsable --dependency=afterok:"${array%%;*}" --job-name=grade-merge \
        --cpus-per-task=1 --mem=4G --time=00:30:00 --chdir="$PWD" \
        --output="$RESULTS/grade-merge-%j.log" \
        --wrap="\"$PYTHON\" -m course_lib grade-merge \"$RESULTS/grades.csv\" \"$RESULTS\"/shard-*.csv --gradebook \"$RESULTS/gradebook.csv\" --feedback \"$RESULTS/feedback\""
    echo "submitted shards as job $array (seed $SEED), merge after them"
    exit 0
fi

# On a compute node: one shard, K = SLURM_ARRAY_TASK_ID + 1 of SHARDS.
K=$((SLURM_ARRAY_TASK_ID + 1))
"$PYTHON" -m course_lib grade "$SUBMISSIONS" \
    --shard $((SLURM_ARRAY_TASK_ID + 1))/"$SHARDS" --seed "$SEED" \
    --jobs "${SLURM_CPUS_PER_TASK:-1}" \
    --out "$RESULTS/shard-$K.csv" --feedback "$RESULTS/feedback"
