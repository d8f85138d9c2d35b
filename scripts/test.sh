#!/usr/bin/env bash
# Builds Fathom and runs every test (C++ unit tests, fixture goldens, Python reference checks,
# a short fuzzing run). Expects scripts/install_deps.sh to have run once on the machine: the
# Python tests run with its venv (.venv, through scripts/build.sh) and fail without it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python3 ] && [ -z "${FATHOM_PYTHON:-}" ]; then
  echo "note: no .venv (scripts/install_deps.sh makes it): the Python tests will use python3" >&2
fi
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --label-exclude gpu "$@"
