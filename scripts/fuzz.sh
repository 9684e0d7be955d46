#!/usr/bin/env bash
# Fuzzes the ONNX importer and import + shape inference + compilation with
# libFuzzer (AddressSanitizer + UndefinedBehaviorSanitizer build, build-asan/).
#   fuzz.sh [SECONDS [TARGET...]]    default: 60 s, every target, run side by side
# Targets: onnx_import_fuzzer (bytes), compile_fuzzer (bytes through compilation),
# model_fuzzer (structure-aware mutations through compilation and one run).
# Seeds: the ONNX backend node tests' models and the zoo's models with small
# weights (scripts/make_fuzz_seeds.py; zoo models are taken from build/models when
# exported there). Corpora grow in build-asan/fuzz/corpus/<target>; a crash, leak,
# timeout or sanitizer report stops that target and leaves its input in
# build-asan/fuzz/artifacts/<target>/. Fixed inputs go to tests/fuzz/regressions/<target>/,
# where the `error` test label replays them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(onnx_import_fuzzer compile_fuzzer model_fuzzer); fi
./scripts/build_sanitized.sh asan
work=build-asan/fuzz
if [ ! -d "$work/seeds" ]; then
  zoo=()
  if ls build/models/*.onnx > /dev/null 2>&1; then zoo=(--zoo-dir build/models); fi
  .venv/bin/python scripts/make_fuzz_seeds.py "$work/seeds" "${zoo[@]}"
fi
# The targets link libFuzzer, which puts libstdc++ ahead of the shared ASan
# runtime in their library list: preload the runtime so that it comes first.
asan_runtime="$(clang -print-file-name=libclang_rt.asan-x86_64.so)"
pids=()
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  # Leaks are checked; the JIT's and LLVM's process-lifetime state is not a leak per input.
  LD_PRELOAD="$asan_runtime" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
    "build-asan/tests/fuzz/$t" "$work/corpus/$t" "$work/seeds" \
      -max_total_time="$seconds" -timeout=60 -rss_limit_mb=6144 -max_len=65536 \
      -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 \
      > "$work/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  t="${targets[$i]}"
  if wait "${pids[$i]}"; then
    echo "$t: no crash in ${seconds} s; $(grep -E 'stat::number_of_executed_units' "$work/$t.log" | tail -1);" \
         "corpus $(ls "$work/corpus/$t" | wc -l) inputs"
  else
    status=1
    echo "$t: FAILED, see $work/$t.log and $work/artifacts/$t/"
    grep -E "ERROR|SUMMARY|Test unit written" "$work/$t.log" | head -5 || true
  fi
done
exit $status
