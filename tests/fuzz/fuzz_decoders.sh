#!/usr/bin/env bash
# Builds the decoders' libFuzzer target (decoders_fuzz.cc) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs it for a bounded time from the seeds in corpus/.
# A crash leaves its input as WORK_DIR/crash-* and fails; add it to corpus/ (and a test)
# once fixed.
# Usage: fuzz_decoders.sh SOURCE_DIR WORK_DIR TORCH_DIR [SECONDS]  (default 60)
set -euo pipefail
src=$1 work=$2 torch=$3 seconds=${4:-60}
mkdir -p "$work/decoders-corpus"
cp -n "$src/tests/fuzz/corpus/"* "$work/decoders-corpus/"
binary=$work/decoders_fuzz
sources=(
  tests/fuzz/decoders_fuzz.cc
  src/serialize/record.cc src/serialize/error_record.cc src/contract/atomic_file.cc
  src/contract/abrupt_end.cc src/contract/front_end.cc src/contract/option_table.cc
  src/sgpu/errors.cc
  sim/faults.cc sim/node_spec.cc src/backend/gpu_type.cc
  src/sgpu/checkpoint/manifest.cc src/sgpu/checkpoint/safetensors.cc
  src/tracking/spool.cc src/tracking/log_batch.cc src/tracking/run_model.cc
  src/tracking/validation.cc src/tracking/pending_record.cc src/model/platform.cc
  src/contract/rank_env.cc src/sgpu/parallel/zero_config.cc
  src/serialize/node_report.cc src/nodes/nodes.cc
)
paths=("${sources[@]/#/$src/}")
stale() {
  [[ ! -x $binary ]] ||
    [[ -n $(find "${paths[@]}" "$src/src" "$src/sim" \( -name '*.h' -o -name '*.cc' \) \
      -newer "$binary" | head -1) ]]
}
if stale; then
  # Two unity files (every other source in each), one per job, then one link: libtorch's
  # headers are read twice, not once per source (45 s, not about 200 s, on 2 cores).
  flags=(-std=c++20 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
    -D_GLIBCXX_USE_CXX11_ABI=1 -I"$src/src" -I"$src"
    -DSGPU_PLATFORM_SOURCE_DIR="\"$src/src/model/platforms\"" -DSGPU_PLATFORM_INSTALL_DIR="\"/nonexistent\""
    -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include")
  objects=$work/decoders-objects
  rm -rf "$objects" && mkdir -p "$objects"
  for i in "${!paths[@]}"; do echo "#include \"${paths[$i]}\"" >>"$objects/unity_$((i % 2)).cc"; done
  pids=()
  for u in 0 1; do
    "${CXX:-clang++}" "${flags[@]}" -c "$objects/unity_$u.cc" -o "$objects/unity_$u.o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  "${CXX:-clang++}" -fsanitize=fuzzer,address,undefined "$objects"/*.o \
    -L"$torch/lib" -Wl,-rpath,"$torch/lib" -ltorch_cpu -lc10 -lz -o "$binary.new"
  mv "$binary.new" "$binary"
fi
# Fresh inputs it finds go to the work folder's corpus, never to the repository.
ASAN_OPTIONS=detect_leaks=0 "$binary" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=4096 -artifact_prefix="$work/" "$work/decoders-corpus"
