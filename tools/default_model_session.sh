#!/usr/bin/env bash
# The default model's GPU session (issue 16), on a machine of two GPUs (one works: the variants
# then train one after the other). Needs the corpus of tools/make_default_corpus.py and the
# binaries of tools/device_session.sh, carried in ignored folders:
#   .traincarry/gz/{train,heldout}.txt.gz   .devcarry/{bin/fathom,lib}
# 1. trains two variants side by side (MTP loss weight 0.5 and 1.0; the same data, seed and time
#    budget), keeps the one whose MTP layer agrees more with the main model's greedy token after
#    next on held-out text;
# 2. writes its goldens with transformers (tools/make_default_goldens.py);
# 3. measures speculative decoding on held-out text on the GPU (bench/spec_text.py);
# 4. compares greedy outputs split over 2 GPUs with one GPU (tools/compare_split_greedy.py);
# and returns the model folder as a tar in 15 MB parts after step 2 (train_state.pt stays behind).
# usage: tools/default_model_session.sh [MINUTES]   (results under $OUT)
set -uo pipefail
NV=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in os.listdir(p)))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devcarry/lib:/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
BIN=$PWD/.devcarry/bin
CORPUS=/tmp/corpus
mkdir -p $CORPUS && for f in train heldout; do gunzip -c .traincarry/gz/$f.txt.gz > $CORPUS/$f.txt; done
TOK=$PWD/tests/fixtures/tokenizers/fathom_default
MINUTES=${1:-4.5}
mkdir -p "$OUT"
GPUS=$(nvidia-smi --list-gpus | wc -l)
echo "=== train ($(date +%T)), $GPUS GPUs, $MINUTES minutes"
train() {  # $1 GPU, $2 out dir, $3... flags
  local gpu=$1 dir=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu python3 tools/train_default_model.py "$CORPUS" "$TOK" "$dir" --minutes "$MINUTES" \
    --chat-fraction 0.15 --seed 0 --state /tmp/state_$(basename "$dir").pt "$@" > "$OUT/train_$(basename "$dir").log" 2>&1
}
if [ "$GPUS" -ge 2 ]; then
  train 0 /tmp/mtp05 --mtp-weight 0.5 & train 1 /tmp/mtp10 --mtp-weight 1.0 & wait
else
  train 0 /tmp/mtp05 --mtp-weight 0.5; train 0 /tmp/mtp10 --mtp-weight 1.0
fi
for d in /tmp/mtp05 /tmp/mtp10; do echo "$d: $(grep -E '^held out|^parameters' "$OUT/train_$(basename $d).log" | tr '\n' ' ')"; done
M=$(python3 -c "
import json
best = max(['/tmp/mtp05', '/tmp/mtp10'], key=lambda d: json.load(open(d + '/train_log.json'))['mtp_top1_agreement'])
print(best)")
echo "kept $M"
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$M/"
cp "$OUT/train_$(basename $M).log" "$M/train.log"
echo "=== goldens ($(date +%T))"
python3 tools/make_default_goldens.py "$M" "$CORPUS/heldout.txt" 2>&1 | grep -vE "Warning|warn" | tail -5
tar -C "$(dirname $M)" --exclude='*.pt' -cf - "$(basename $M)" | split -b 15m - "$OUT/model.tar.part-"  # back first, whatever follows
echo "=== chat ($(date +%T))"
timeout 60 "$BIN/fathom" chat "$M" --prompt "Tell me about the sea." --max-new-tokens 60 2>&1 | tail -4
echo "=== speculative decoding on held-out text, GPU ($(date +%T))"
timeout 200 python3 bench/spec_text.py --fathom "$BIN/fathom" --model "$M" --heldout "$CORPUS/heldout.txt" \
  --device cuda --prompts 6 --new-tokens 128 --json-out "$OUT/spec_gpu.json" 2>&1 | tee "$OUT/spec_gpu.log"
if [ "$GPUS" -ge 2 ]; then
  echo "=== 2 GPUs against 1 ($(date +%T))"
  timeout 120 python3 tools/compare_split_greedy.py "$BIN/fathom" "$M" --splits 1 2 2,ep --vocab 8192 \
    --new-tokens 256 2>&1 | tee "$OUT/greedy_default.log"
fi
ls -la "$OUT"
echo "=== done ($(date +%T))"
