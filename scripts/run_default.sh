#!/usr/bin/env bash
# The main job on the embedded default model: inspect it, then greedy-generate from a prompt.
# The default model is the tiny random Qwen3.5-MoE fixture checked into tests/fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tests/fixtures/qwen35_moe}
build/fathom inspect "$MODEL"
build/fathom generate "$MODEL" --token-ids 1,2,3,4,5 --max-new-tokens 16 --json
