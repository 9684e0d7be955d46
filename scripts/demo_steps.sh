#!/usr/bin/env bash
# The demo's steps on an existing build: export resnet18 (random weights,
# fixed seed) with expected outputs from ONNX Runtime, then show, compile and
# run it with Kiln (checked against those outputs) and benchmark it.
#   demo_steps.sh [BUILD_DIR [OUT_DIR [BENCH_RUNS]]]
# Run by scripts/demo.sh and by the `demo` test (tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out="${2:-$build/demo}"
runs="${3:-10}"
mkdir -p "$out"
.venv/bin/python scripts/make_demo_model.py "$out"
# The report is written whole, then its head shown: piping it into `head`
# would end kiln with SIGPIPE, which pipefail turns into a failure.
"$build/bin/kiln" info "$out/model.onnx" > "$out/info.txt"
sed -n 1,20p "$out/info.txt"
"$build/bin/kiln" run "$out/model.onnx" --test-data "$out/test_data_set_0"
"$build/bin/kiln" bench "$out/model.onnx" --runs "$runs"
