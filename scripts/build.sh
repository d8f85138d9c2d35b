#!/usr/bin/env bash
# Configures and builds Fathom into build/ (CUDA sources are compiled when nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python tests run with FATHOM_PYTHON, by default the venv of scripts/install_deps.sh.
py=python3
if [ -x .venv/bin/python3 ]; then py="$PWD/.venv/bin/python3"; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFATHOM_PYTHON="${FATHOM_PYTHON:-$py}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
