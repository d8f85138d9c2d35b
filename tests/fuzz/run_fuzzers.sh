#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into BUILD_DIR and runs each for SECONDS seconds on the
# committed seed corpus. Exit 77 (ctest SKIP) when clang++ is missing; non-zero on any finding.
# Usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR [SECONDS]
set -euo pipefail
src=${1:?usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR [SECONDS]}
build=${2:?usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR [SECONDS]}
secs=${3:-15}
src=$(cd "$src" && pwd)

CXX_BIN=$(command -v clang++ || command -v clang++-14 || true)
CC_BIN=$(command -v clang || command -v clang-14 || true)
if [[ -z "$CXX_BIN" || -z "$CC_BIN" ]]; then
  echo "clang++ not found: skipping the fuzz run"
  exit 77
fi

mkdir -p "$build"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=$CC_BIN CXX=$CXX_BIN cmake -S "$src" -B "$build" "${gen[@]}" -DFATHOM_BUILD_FUZZERS=ON \
    -DFATHOM_BUILD_TESTS=OFF -DFATHOM_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 \
    || { cat "$build/configure.log"; exit 1; }
fi
nice -n 5 cmake --build "$build" -j2 --target fuzz_safetensors fuzz_config fuzz_request

status=0
for name in safetensors config request; do
  work="$build/corpus_work/$name"
  artifacts="$build/artifacts/$name/"
  mkdir -p "$work" "$artifacts"
  echo "== fuzz_$name for ${secs}s"
  if ! "$build/fuzz_$name" -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "$src/tests/fuzz/corpus/$name" 2>"$build/fuzz_$name.log"; then
    echo "fuzz_$name found a problem (artifacts in $artifacts):"
    tail -n 60 "$build/fuzz_$name.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$build/fuzz_$name.log" || true
  fi
done
exit $status
