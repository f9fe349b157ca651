#!/usr/bin/env bash
# Builds the safetensors reader's libFuzzer target with clang (address and undefined
# sanitizers) and runs it for a bounded time from the seeds in fuzz_corpus/.
# Usage: fuzz_safetensors.sh SOURCE_DIR WORK_DIR TORCH_DIR [SECONDS]
set -euo pipefail
src=$1 work=$2 torch=$3 seconds=${4:-25}
mkdir -p "$work/corpus"
cp -n "$src/tests/checkpoint/fuzz_corpus/"* "$work/corpus/"
binary=$work/safetensors_fuzz
objects=("$src/tests/checkpoint/safetensors_fuzz.cc" "$src/src/sgpu/checkpoint/safetensors.cc")
if [[ ! -x $binary || -n $(find "${objects[@]}" "$src/src/sgpu/checkpoint/safetensors.h" -newer "$binary") ]]; then
  "${CXX:-clang++}" -std=c++20 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -D_GLIBCXX_USE_CXX11_ABI=1 -I"$src/src" -isystem "$torch/include" \
    -isystem "$torch/include/torch/csrc/api/include" "${objects[@]}" \
    -L"$torch/lib" -Wl,-rpath,"$torch/lib" -ltorch_cpu -lc10 -o "$binary.new"
  mv "$binary.new" "$binary"
fi
# Fresh inputs it finds go to the work folder's corpus, never to the repository.
ASAN_OPTIONS=detect_leaks=0 "$binary" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=4096 -artifact_prefix="$work/" "$work/corpus"
