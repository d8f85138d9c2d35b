#!/usr/bin/env bash
# GPU tests (need an NVIDIA GPU): the CUDA engine against the CPU reference on every fixture,
# graphs and ragged batches, and a 4,096-token prompt on a mid-size random checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
MID=${FATHOM_MIDSIZE_CHECKPOINT:-/tmp/fathom-midsize}
[ -f "$MID/config.json" ] || python3 tools/make_random_checkpoint.py "$MID"
FATHOM_MIDSIZE_CHECKPOINT=$MID ctest --test-dir build --output-on-failure --label-regex gpu "$@"
