#!/usr/bin/env bash
# The main job: install dependencies, build Kiln, export a model (torchvision
# resnet18 with random weights, fixed seed) and compile and run it with Kiln,
# checking the result against ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
mkdir -p build/demo
.venv/bin/python scripts/make_demo_model.py build/demo
./build/bin/kiln info build/demo/model.onnx | head -20
./build/bin/kiln run build/demo/model.onnx --test-data build/demo/test_data_set_0
./build/bin/kiln bench build/demo/model.onnx --runs 10
