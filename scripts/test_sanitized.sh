#!/usr/bin/env bash
# The sanitizer suites (run by .ci/run after scripts/test.sh):
#   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/): the unit, error
#   and onnx test labels, and the fuzz targets' regression inputs (label error);
#   ThreadSanitizer (build-tsan/): the concurrency test.
# Extra arguments go to the ASan ctest run, e.g. -R onnx.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
./scripts/build_sanitized.sh asan
built=$(date +%s)
(cd build-asan && ctest --output-on-failure --no-tests=error -L 'unit|error|onnx' "$@")
tested=$(date +%s)
./scripts/build_sanitized.sh tsan
TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" build-tsan/tests/driver_concurrency_test
end=$(date +%s)
echo "[test_sanitized] asan+ubsan build $((built - start)) s, tests $((tested - built)) s;" \
     "tsan build and test $((end - tested)) s; total $((end - start)) s"
