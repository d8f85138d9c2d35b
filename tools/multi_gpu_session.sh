#!/usr/bin/env bash
# Multi-GPU runs (issue 18): Qwen3.5-397B-A17B shapes (NVFP4 routed experts, dummy weights) split
# over 2, 4 and 8 GPUs of one host. For each N that is visible: the tensor-parallel tests (split
# against whole on the fixtures), `fathom bench` (decode and prefill per GPU, bytes each GPU moves,
# the collectives' share with --profile) and `fathom serve --tensor-parallel-size N` under
# `fathom bench serve`. Binaries as for tools/device_session.sh (.devcarry/{bin,lib}).
# usage: tools/multi_gpu_session.sh [N ...]   (default: 2 4 8, those with enough GPUs)
# Full depth (60 layers, 249 GB of weights) fits 4 and 8 H200s; on 2 it is cut to 36 layers
# (docs/design.md, "Splitting over GPUs", has the arithmetic). Results under $OUT.
set -uo pipefail
NV=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in os.listdir(p)))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devcarry/lib:/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the engine sets it too)
OUT=${OUT:-/tmp/out}
BIN=$PWD/.devcarry/bin
CFG=configs/qwen3.5-397b-a17b.json
mkdir -p "$OUT"
GPUS=$(nvidia-smi --list-gpus | wc -l)
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
echo "$GPUS GPUs visible"
timeout 600 "$BIN/test_cuda" --gtest_filter='*TensorParallel*:*NcclCommunicator*' 2>&1 \
  | grep -E "NCCL|GPUs vs|OK|FAILED|Failure|SKIPPED" | tee "$OUT/tp_tests.log"
for N in "${@:-2 4 8}"; do
  [ "$N" -le "$GPUS" ] || { echo "N=$N: only $GPUS GPUs, skipped"; continue; }
  LAYERS=60; [ "$N" -lt 4 ] && LAYERS=36
  echo "== N=$N, $LAYERS layers"
  timeout 900 "$BIN/fathom" bench $CFG --load-format dummy --num-layers $LAYERS --tensor-parallel-size "$N" \
    --batch 1,8,64,128 --input-len 4096 --output-len 64 --json-out "$OUT/bench_tp$N.json" 2>&1 | tee "$OUT/bench_tp$N.log"
  timeout 600 "$BIN/fathom" bench $CFG --load-format dummy --num-layers $LAYERS --tensor-parallel-size "$N" \
    --batch 1,64 --input-len 512 --output-len 16 --profile 2>&1 > "$OUT/profile_tp$N.log"
  grep -E "^decode|allreduce|allgather" "$OUT/profile_tp$N.log"
  "$BIN/fathom" serve $CFG --device cuda --load-format dummy --num-layers $LAYERS --tensor-parallel-size "$N" \
    --skip-tokenizer-init --max-model-len 4096 --max-num-seqs 128 --port 18700 > "$OUT/serve_tp$N.log" 2>&1 &
  SRV=$!
  for _ in $(seq 900); do
    kill -0 $SRV 2>/dev/null || break
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18700/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  timeout 900 "$BIN/fathom" bench serve --url http://127.0.0.1:18700 --concurrency 1,64,128 --input-len 512 \
    --output-len 256 --num-prompts 256 --vocab-size 248320 --no-progress 2>&1 | tee "$OUT/bench_serve_tp$N.log"
  kill $SRV; wait $SRV 2>/dev/null; tail -3 "$OUT/serve_tp$N.log"
done
