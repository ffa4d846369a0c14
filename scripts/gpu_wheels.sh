#!/usr/bin/env bash
# Download, on a machine with network, the wheels a GPU host without network needs
# beside its own torch, triton, numpy, matplotlib and pytest: nbval and the Jupyter
# kernel stack, pytest-xdist, colt5-attention, at the versions pinned in requirements.txt,
# for CPython 3.12 on x86-64.
#   bash scripts/gpu_wheels.sh [DEST]          (default .whl; PYTHON_VERSION=3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
python_version=${PYTHON_VERSION:-3.12}
packages=(
  nbval nbformat nbclient ipykernel ipython ipython_pygments_lexers jupyter_client
  jupyter_core traitlets pyzmq tornado comm debugpy matplotlib-inline jedi parso
  prompt_toolkit wcwidth pexpect ptyprocess stack_data executing asttokens pure_eval
  fastjsonschema jsonschema jsonschema-specifications referencing rpds-py platformdirs
  nest-asyncio2 colt5-attention einops local-attention pytest-xdist execnet
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
mkdir -p "$dest"
for name in "${packages[@]}"; do
  pin=$(grep -i -E "^${name//[-_]/[-_]}==" requirements.txt) || { echo "no pin for $name in requirements.txt" >&2; exit 1; }
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d "$dest" "$pin"
done
ls "$dest"
