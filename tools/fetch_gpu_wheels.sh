#!/usr/bin/env bash
# Download the wheels that tools/gpu_check.sh needs to execute notebooks on the GPU machine.
#
# That machine has Python 3.12 with torch, triton, transformers, pytest, hypothesis,
# matplotlib and numpy, but no Jupyter packages and no internet. This fetches nbclient,
# nbformat, ipykernel, ipywidgets and every runtime dependency of theirs that the machine lacks
# (its image already holds attrs, packaging, psutil, pygments, python-dateutil, six and
# typing-extensions), as cp312 manylinux x86_64 wheels, into .whl/ at the repository root
# (git-ignored; the lead passes it to the device tool with carry [".whl"]). Versions are the
# ones pinned in requirements/constraints.txt. debugpy (ipykernel's debugger, the largest
# wheel) is left out: ipykernel runs without it and only the debugger is then unavailable;
# so are the browser halves of ipywidgets (widgetsnbextension, jupyterlab_widgets): the
# notebooks import ipywidgets, which needs neither to run.
#
# Usage: bash tools/fetch_gpu_wheels.sh [DEST]   (DEST defaults to .whl)
set -euo pipefail

cd "$(dirname "$0")/.."
dest=${1:-.whl}
python=${PYTHON:-python3}
constraints=requirements/constraints.txt

packages=(
    nbclient nbformat ipykernel
    jupyter_client jupyter_core traitlets pyzmq tornado platformdirs
    fastjsonschema jsonschema jsonschema-specifications referencing rpds-py
    comm nest-asyncio2 matplotlib-inline ipywidgets
    ipython ipython_pygments_lexers jedi parso prompt_toolkit wcwidth
    pexpect ptyprocess stack-data asttokens executing pure_eval
)

# The pinned version of a package, matching names the way pip does (case, '-', '_', '.').
pinned() {
    local want
    want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
    awk -F'==' -v want="$want" '
        !/^#/ && NF == 2 { name = tolower($1); gsub(/[_.]/, "-", name)
                           if (name == want) { print $2; exit } }' "$constraints"
}

specs=()
for name in "${packages[@]}"; do
    version=$(pinned "$name")
    if [[ -z $version ]]; then
        echo "error: $name is not pinned in $constraints" >&2
        exit 1
    fi
    specs+=("$name==$version")
done

rm -rf "$dest"
mkdir -p "$dest"
"$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --quiet -d "$dest" "${specs[@]}"
count=$(find "$dest" -type f -name '*.whl' | wc -l)
echo "$count wheels, $(du -sh "$dest" | cut -f1) in $dest"
if [[ $count -ne ${#packages[@]} ]]; then
    echo "error: expected ${#packages[@]} wheels" >&2
    exit 1
fi
