#!/usr/bin/env bash
# The main job: install dependencies, build Kiln, export a model (torchvision
# resnet18 with random weights, fixed seed) and compile and run it with Kiln,
# checking the result against ONNX Runtime, then benchmark it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
./scripts/demo_steps.sh build build/demo 10
