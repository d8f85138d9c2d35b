#!/usr/bin/env bash
# Multi-GPU runs (issue 18): Qwen3.5-397B-A17B shapes (NVFP4 routed experts, BF16 elsewhere, the
# MTP layer, dummy weights) split over the N GPUs of one host. Binaries as for
# tools/device_session.sh (.devcarry/{bin,lib}); results under $OUT. Stages, in order:
#   tests   the tensor-parallel GPU tests (N GPUs against one, NCCL, peer collectives)
#   greedy  a synthetic Qwen3.5-35B-A3B checkpoint (NVFP4 release layout): greedy tokens at N GPUs
#           (by column and by expert) against one GPU (tools/compare_split_greedy.py)
#   bench   `fathom bench` at full depth (60 layers) by column and by expert (bench-tp, bench-ep):
#           decode at batch 1, 8, 64, prefill 4K, the per-op profile (collectives' share); batch
#           256 at a cut depth where 60 layers' DeltaNet state does not fit (bench-cut)
#   spec    MTP verify and draft costs at full depth
#   depth   the greedy comparison on the 35B layout cut to 4 layers
#   serve   `fathom serve --tensor-parallel-size N` under `fathom bench serve` (512 in, 256 out) at
#           concurrency 1, 16, 64, 256, plain and with MTP (serve-mtp: MTP only)
# usage: tools/multi_gpu_session.sh N [stage ...]   (default: tests greedy bench spec serve depth)
set -uo pipefail
NV=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in os.listdir(p)))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devcarry/lib:/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # multicast stays off
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
BIN=$PWD/.devcarry/bin
CFG=configs/qwen3.5-397b-a17b.json
N=${1:?usage: multi_gpu_session.sh N [stage ...]}
shift
mkdir -p "$OUT"
GPUS=$(nvidia-smi --list-gpus | wc -l)
[ "$N" -le "$GPUS" ] || { echo "N=$N: only $GPUS GPUs"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; head -4 "$OUT/topo.txt"
# Full depth needs 4 GPUs or more for 256 sequences of DeltaNet state (docs/design.md, "What fits").
DEEP=60; CUT=30

wait_healthy() {
  for _ in $(seq 300); do
    kill -0 "$2" 2>/dev/null || { echo "server on port $1 exited"; return 1; }
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}
# bench serve at concurrency $3 with $4 requests against port $1, appended to $OUT/$2.log.
bench_serve() {
  timeout 120 "$BIN/fathom" bench serve --url "http://127.0.0.1:$1" --concurrency "$3" --num-prompts "$4" \
    --input-len 512 --output-len 256 --vocab-size 248320 --no-progress 2>&1 | tee -a "$OUT/$2.log" \
    | grep -E "^Concurrency|concurrency|Output token throughput|Median TTFT|Median TPOT|Median ITL|Failed"
}
# `fathom serve` at full depth on port $1, log $OUT/$2.log, extra flags $3...; then bench serve at
# the concurrency levels in $LEVELS.
serve_and_bench() {
  local port=$1 name=$2; shift 2
  "$BIN/fathom" serve $CFG --device cuda --load-format dummy --num-layers $DEEP --tensor-parallel-size "$N" \
    --skip-tokenizer-init --max-model-len 4096 --max-num-seqs ${SEQS:-64} --gpu-memory-utilization 0.95 \
    --port "$port" "$@" > "$OUT/$name.log" 2>&1 &
  local srv=$!
  if wait_healthy "$port" $srv; then
    grep -E "KV cache|captured|weights" "$OUT/$name.log" | head -4
    for lv in $LEVELS; do bench_serve "$port" "bench_$name" ${lv%:*} ${lv#*:}; done
  else
    tail -8 "$OUT/$name.log"
  fi
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  grep -E "error|Error" "$OUT/$name.log" | head -3
}

for stage in "${@:-tests greedy bench spec serve depth}"; do
  for what in $stage; do
    echo "=== $what ($(date +%T))"
    case $what in
      tests)
        timeout 240 "$BIN/test_cuda" --gtest_filter='*TensorParallel*:*NcclCommunicator*:*PeerCommunicator*:*CudaSplit*' \
          > "$OUT/tp_tests.log" 2>&1
        echo "test_cuda rc=$?"; grep -E "GPUs vs|OK \]|FAILED|Failure|SKIPPED|PASSED" "$OUT/tp_tests.log" | tail -30 ;;
      greedy)
        python3 tools/make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /tmp/q35 --format nvfp4 --jobs 16 2>&1 | tail -1
        timeout 300 python3 tools/compare_split_greedy.py "$BIN/fathom" /tmp/q35 --splits 1 "$N" "$N,ep" \
          --new-tokens 256 2>&1 | tee "$OUT/greedy.log"
        echo "compare rc=${PIPESTATUS[0]}" ;;
      bench|bench-tp|bench-ep|bench-cut)
        # Full depth, by column and by expert: decode, prefill 4K and the per-op profile.
        for ep in "" --enable-expert-parallel; do
          name=bench_tp$N; [ -n "$ep" ] && name=bench_ep$N
          case $what in bench-tp) [ -n "$ep" ] && continue ;; bench-ep) [ -z "$ep" ] && continue ;; bench-cut) continue ;; esac
          timeout 150 stdbuf -oL "$BIN/fathom" bench $CFG --load-format dummy --num-layers $DEEP --tensor-parallel-size "$N" \
            $ep --batch 1,8,64 --input-len 4096 --output-len 64 --repeats 3 --profile \
            --json-out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
          echo "rc=$? $ep"; grep -E "^(fathom|device|weights|prefill|decode)|allreduce|allgather|per-op|collectives" "$OUT/$name.log"
        done
        # Batch 256 at a cut depth (with 64 for the link to full depth), both splits.
        case $what in bench|bench-cut) ;; *) continue ;; esac
        for ep in "" --enable-expert-parallel; do
          timeout 120 stdbuf -oL "$BIN/fathom" bench $CFG --load-format dummy --num-layers $CUT --tensor-parallel-size "$N" $ep \
            --batch 64,256 --input-len 4096 --output-len 32 --repeats 1 > "$OUT/bench_cut$N$ep.log" 2>&1
          echo "rc=$? $ep"; grep -E "^(fathom|weights|decode)" "$OUT/bench_cut$N$ep.log"
        done ;;
      spec)
        # MTP verify and draft costs at full depth, by column (the break-even acceptance follows).
        timeout 200 stdbuf -oL "$BIN/fathom" bench $CFG --load-format dummy --num-layers $DEEP --tensor-parallel-size "$N" \
          --batch 1 --input-len 4096 --output-len 32 --repeats 1 --speculative-num-steps 1,2,3 --speculative-batch 1,8 \
          --json-out "$OUT/spec_tp$N.json" > "$OUT/spec_tp$N.log" 2>&1
        echo "rc=$?"; grep -E "^(weights|decode|speculative)|K=" "$OUT/spec_tp$N.log" ;;
      depth)
        # The same comparison on the 35B layout cut to 4 layers: rounding that deep random
        # networks amplify (routing flips) against a wrong split.
        python3 tools/make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /tmp/q35cut --format nvfp4 --num-layers 4 2>&1 | tail -1
        timeout 200 python3 tools/compare_split_greedy.py "$BIN/fathom" /tmp/q35cut --splits 1 "$N" "$N,ep" \
          --new-tokens 256 2>&1 | tee "$OUT/greedy_cut.log" ;;
      serve)
        LEVELS="1:4 16:32 64:128 256:256" serve_and_bench 18700 serve_tp$N ;;&
      serve|serve-mtp)
        # The MTP layer's verify rows need room: 16 sequences at full depth on 2 GPUs.
        LEVELS="1:4 16:32" SEQS=16 serve_and_bench 18701 serve_mtp$N --speculative-algorithm mtp --speculative-num-steps 1 ;;
    esac
  done
done
echo "=== done ($(date +%T))"
