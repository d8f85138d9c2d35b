#!/usr/bin/env bash
# The main job on the embedded default model (models/fathom-tiny-moe: a small Qwen3.5-MoE trained
# here on public-domain English text, with its MTP layer): what is in it, then one chat answer.
# usage: scripts/run_default.sh [MODEL] [MESSAGE]   (fathom chat MODEL with no --prompt is interactive)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/fathom-tiny-moe}
MESSAGE=${2:-Tell me about the sea.}
build/fathom inspect "$MODEL"
echo
echo "> $MESSAGE"
build/fathom chat "$MODEL" --prompt "$MESSAGE" --max-new-tokens 96
