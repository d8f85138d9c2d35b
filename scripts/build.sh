#!/usr/bin/env bash
# Configures and builds Fathom into build/ (CUDA sources are compiled when nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
