#!/usr/bin/env bash
# One GPU-machine session (see docs/perf.md): regenerate the fixtures with transformers, run the
# GPU tests and the CPU golden tests on them, and the roofline benchmark. Binaries are built on
# the developer machine (-DFATHOM_PORTABLE=ON) and carried in .devcarry/{bin,lib}.
# usage: tools/device_session.sh [fixtures|tests|bench|serve|spec|load|all]...   (results under $OUT)
set -uo pipefail
# CUDA libraries: the toolkit's, else the ones PyTorch's wheels bring.
NV=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, d, 'lib') for p in nvidia.__path__ for d in os.listdir(p)))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.devcarry/lib:/usr/local/cuda/lib64:${NV}:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
BIN=$PWD/.devcarry/bin
mkdir -p "$OUT"
# Waits until the server on port $1 (process $2) answers /health; fails if the process exits.
wait_healthy() {
  for _ in $(seq 600); do
    kill -0 "$2" 2>/dev/null || { echo "server on port $1 exited"; return 1; }
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for what in "${@:-all}"; do
  case $what in
    fixtures|all)
      python3 tools/make_fixtures.py --out /tmp/fx --device cuda > "$OUT/fixtures.log" 2>&1
      echo "make_fixtures rc=$?"; tail -20 "$OUT/fixtures.log"
      tar -C /tmp/fx -czf "$OUT/fixtures.tgz" . ;;&
    tests|all)
      FX=/tmp/fx; [ -d $FX ] || FX=$PWD/tests/fixtures
      [ -f /tmp/midsize/config.json ] || python3 tools/make_random_checkpoint.py /tmp/midsize
      FATHOM_FIXTURES_DIR=$FX "$BIN/test_model" > "$OUT/test_model.log" 2>&1; echo "test_model rc=$?"
      grep -E "spread|PASSED|FAILED" "$OUT/test_model.log" | tail -8
      FATHOM_FIXTURES_DIR=$FX FATHOM_MIDSIZE_CHECKPOINT=/tmp/midsize timeout 900 "$BIN/test_cuda" > "$OUT/test_cuda.log" 2>&1
      echo "test_cuda rc=$?"; grep -E "spread|agrees|OK|FAILED|Failure|error" "$OUT/test_cuda.log" | tail -40 ;;&
    bench|all)
      timeout 600 "$BIN/fathom" bench configs/qwen3.5-397b-a17b.json --load-format dummy --num-layers 28 \
        --batch 1,8,64 --input-len 4096 --output-len 64 --profile --json-out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
      # The same decode steps without programmatic dependent launch (what PDL is worth).
      FATHOM_PDL=0 timeout 300 "$BIN/fathom" bench configs/qwen3.5-397b-a17b.json --load-format dummy --num-layers 28 \
        --batch 1,64 --input-len 4096 --output-len 64 2>&1 | grep -E "^(prefill|decode)" | tee "$OUT/bench_no_pdl.log"
      # The NVFP4 expert kernels alone, every variant (tests/cuda/test_cuda_moe.cpp).
      timeout 300 "$BIN/test_cuda" --gtest_also_run_disabled_tests --gtest_filter='*KernelThroughput*' 2>&1 \
        | grep "T=" | tee "$OUT/moe_kernels.log" ;;&
    serve|all)
      # OpenAI server on the CUDA engine (dummy 397B-shape weights, token-id prompts) driven by
      # `fathom bench serve` at concurrency 1, 16 and 64.
      "$BIN/fathom" serve configs/qwen3.5-397b-a17b.json --device cuda --load-format dummy --num-layers 28 \
        --skip-tokenizer-init --max-model-len 2048 --max-num-seqs 64 --port 18600 > "$OUT/serve.log" 2>&1 &
      SRV=$!
      wait_healthy 18600 $SRV || { tail -5 "$OUT/serve.log"; continue; }
      timeout 420 "$BIN/fathom" bench serve --url http://127.0.0.1:18600 --concurrency 1,16,64 --input-len 512 \
        --output-len 64 --num-prompts 64 --vocab-size 248320 --no-progress 2>&1 | tee "$OUT/bench_serve.log"
      kill $SRV; wait $SRV; tail -5 "$OUT/serve.log" ;;&
    spec|all)
      # Speculative decoding: draft/verify costs and end-to-end generation at 397B shapes (dummy
      # weights, so acceptance is near 0: what failing drafts cost), the random-fixture overhead,
      # and the server with MTP drafts under load (20 layers: the state history for K + 1
      # positions of 32 sequences needs room beside the weights).
      timeout 420 "$BIN/fathom" bench configs/qwen3.5-397b-a17b.json --load-format dummy --num-layers 20 \
        --batch 1 --input-len 4096 --output-len 64 --speculative-num-steps 1,2,3 --speculative-batch 1,32 \
        --speculative-algorithm mtp --json-out "$OUT/bench_spec.json" 2>&1 | tee "$OUT/bench_spec.log"
      python3 bench/spec_overhead.py --fathom "$BIN/fathom" --device cuda --new-tokens 256 --repeats 5 2>&1 \
        | tee "$OUT/spec_overhead_cuda.md"
      "$BIN/fathom" serve configs/qwen3.5-397b-a17b.json --device cuda --load-format dummy --num-layers 20 \
        --skip-tokenizer-init --max-model-len 2048 --max-num-seqs 32 --port 18601 \
        --speculative-algorithm mtp --speculative-num-steps 2 > "$OUT/serve_spec.log" 2>&1 &
      SRV=$!
      wait_healthy 18601 $SRV || { tail -5 "$OUT/serve_spec.log"; continue; }
      timeout 300 "$BIN/fathom" bench serve --url http://127.0.0.1:18601 --concurrency 1,16 --input-len 512 \
        --output-len 64 --num-prompts 32 --vocab-size 248320 --no-progress 2>&1 | tee "$OUT/bench_serve_spec.log"
      kill $SRV; wait $SRV; tail -5 "$OUT/serve_spec.log" ;;&
    load|all)
      # Real checkpoints at real size (issue 13): a synthetic Qwen3.5-35B-A3B in the layout of the
      # ModelOpt NVFP4 release (24.5 GB), streamed to the GPU: the streamed path against the host
      # path bit for bit on a cut-down copy, the load against its ceiling with the peak host RSS,
      # decode on the loaded weights beside dummy weights, and `fathom serve` with defaults.
      python3 tools/make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /tmp/q35 --format nvfp4 --jobs 8 2>&1 | tail -2
      python3 tools/make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /tmp/q35cut --format nvfp4 --num-layers 4 2>&1 | tail -1
      python3 tools/make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /tmp/q35bf16 --format bf16 --num-layers 4 2>&1 | tail -1
      for d in /tmp/q35cut /tmp/q35bf16; do
        FATHOM_LOAD_CHECKPOINT=$d timeout 300 "$BIN/test_cuda" --gtest_filter='*CudaLoad*' 2>&1 | grep -E "equal|OK|FAILED|Failure|differ" | tail -12
      done
      timeout 300 "$BIN/fathom" bench /tmp/q35 --load-only 2>&1 | tee "$OUT/load.log"
      timeout 420 "$BIN/fathom" bench /tmp/q35 --batch 1,8,64 --input-len 4096 --output-len 64 --repeats 3 \
        --json-out "$OUT/bench_q35.json" 2>&1 | grep -vE "^loading" | tee "$OUT/bench_q35.log"
      timeout 420 "$BIN/fathom" bench configs/qwen3.5-35b-a3b.json --load-format dummy --batch 1,8,64 --input-len 4096 \
        --output-len 64 --repeats 3 2>&1 | tee "$OUT/bench_q35_dummy.log"
      "$BIN/fathom" serve /tmp/q35 --port 18602 > "$OUT/serve_q35.log" 2>&1 &
      SRV=$!
      wait_healthy 18602 $SRV || { tail -5 "$OUT/serve_q35.log"; continue; }
      timeout 300 python3 tools/serve_check.py --url http://127.0.0.1:18602 --long-prompt 32768 --long-output 256 \
        2>&1 | tee "$OUT/serve_q35_check.log"
      kill $SRV; wait $SRV; grep -vE "^loading" "$OUT/serve_q35.log" | tail -8 ;;
  esac
done
