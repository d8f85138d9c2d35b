#!/usr/bin/env bash
# Builds Fathom and runs every test (C++ unit tests, fixture goldens, Python reference checks,
# a short fuzzing run). Expects scripts/install_deps.sh to have run once on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --label-exclude gpu "$@"
