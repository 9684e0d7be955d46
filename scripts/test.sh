#!/usr/bin/env bash
# Installs dependencies, builds Kiln and runs every test suite (CTest labels
# unit, ir, onnx, models, error). Extra arguments go to ctest, e.g. -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
cd build
ctest --output-on-failure --no-tests=error -j1 "$@"
