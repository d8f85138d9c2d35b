#!/usr/bin/env bash
# The shape sweep (issue 29) on a GPU machine: the fixed configs of test_cuda's CudaShapeSweep,
# then configs drawn from seeds FIRST..LAST, each against the fp32 CPU engine; the first
# MEMCHECK_COUNT drawn ones again under compute-sanitizer memcheck with fewer token counts
# (--padding: without it a write past one allocation into the next goes unseen).
# One markdown row per config in OUT_DIR/sweep_table.md; logs beside it.
# usage: tools/shape_sweep.sh TEST_CUDA OUT_DIR [FIRST LAST [MEMCHECK_COUNT]]
set -uo pipefail
bin=$1 out=$2 first=${3:-1} last=${4:-200} memcheck=${5:-50}
mkdir -p "$out"
table=$out/sweep_table.md
echo "| seed | config | result | verdict |" > "$table"
echo "|---|---|---|---|" >> "$table"
FATHOM_SWEEP_TABLE=$table timeout 1200 "$bin" --gtest_filter='CudaShapeSweep.FixedConfigs' > "$out/sweep_fixed.log" 2>&1
echo "fixed configs rc=$?"
FATHOM_SWEEP_TABLE=$table FATHOM_SWEEP_SEEDS=$first-$last timeout 1800 "$bin" --gtest_filter='CudaShapeSweep.DrawnConfigs' \
  > "$out/sweep_drawn.log" 2>&1
echo "drawn configs $first-$last rc=$?"
if [ "$memcheck" -gt 0 ]; then
  mc_table=$out/sweep_memcheck_table.md
  : > "$mc_table"
  FATHOM_SWEEP_QUICK=1 FATHOM_SWEEP_TABLE=$mc_table FATHOM_SWEEP_SEEDS=$first-$((first + memcheck - 1)) timeout 2400 \
    compute-sanitizer --tool memcheck --padding 4096 --error-exitcode 3 --print-limit 20 "$bin" --gtest_filter='CudaShapeSweep.DrawnConfigs' \
    > "$out/sweep_memcheck.log" 2>&1
  echo "memcheck over $memcheck drawn configs rc=$? ($(grep -c '^| ' "$mc_table") configs, $(grep -E 'ERROR SUMMARY' "$out/sweep_memcheck.log"))"
fi
ran=$(grep -c '| ok |' "$table"); refused=$(grep -c 'refused:' "$table"); failed=$(grep -E '^\| [0-9]' "$table" | grep -vc -e '| ok |' -e 'refused:')
echo "sweep: $ran within the bound, $refused refused at load, $failed failed"
