#!/usr/bin/env bash
# Configures and builds Kiln into build/ (Ninja, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C build -j"${KILN_BUILD_JOBS:-$(nproc)}"
