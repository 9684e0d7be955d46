#!/usr/bin/env bash
# Builds Kiln with sanitizers (clang from Debian's packages):
#   build_sanitized.sh asan   build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer,
#                             everything the unit, error and onnx suites need, and the
#                             libFuzzer targets (scripts/fuzz.sh)
#   build_sanitized.sh tsan   build-tsan/: ThreadSanitizer, the runtime and the
#                             concurrency test only (tests/unit/driver_concurrency_test.cc)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: build_sanitized.sh asan|tsan}"
jobs="${KILN_BUILD_JOBS:-$(nproc)}"
case "$kind" in
  asan)
    dir=build-asan
    flags=(-DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON -DKILN_BUILD_BENCHMARKS=OFF)
    targets=()
    ;;
  tsan)
    dir=build-tsan
    flags=(-DKILN_SANITIZE=thread -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_BENCHMARKS=OFF)
    targets=(driver_concurrency_test)
    ;;
  *) echo "unknown sanitizer build '$kind' (asan or tsan)" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" "${flags[@]}"
fi
ninja -C "$dir" -j"$jobs" "${targets[@]}"
