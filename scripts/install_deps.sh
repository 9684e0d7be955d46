#!/usr/bin/env bash
# Installs Kiln's build and test dependencies from Debian's packages and
# creates the Python virtual environment (.venv) with pinned tools from PyPI.
# Safe to run again: apt-get and pip skip what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

PKGS=(
  build-essential cmake ninja-build ccache
  llvm-19-dev llvm-19-tools libzstd-dev zlib1g-dev libedit-dev libffi-dev libxml2-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libdnnl-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev pybind11-dev
  pkg-config libjpeg62-turbo-dev libpng-dev libtiff-dev libwebp-dev libopenjp2-7-dev
  clang libclang-rt-14-dev
  libsqlite3-dev libxgboost-dev libpq-dev postgresql
  python3 python3-dev python3-venv python3-numpy
  python3-torch python3-torchvision
  # The BLAS Debian's torch calls through libblas.so.3: OpenBLAS's takes the
  # alternative from the reference implementation, which the benchmarks'
  # PyTorch side would otherwise run its matrix products on.
  libopenblas0-pthread
  chromium
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install_deps] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The venv sees Debian's torch/torchvision (built for /usr/bin/python3) and
# takes onnx, onnxruntime and numpy pinned from PyPI.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
# The wheels Kiln's own package depends on (numpy, as pinned above), for the
# test that installs Kiln's wheel into a fresh environment offline.
numpy_pin=$(grep -E '^numpy==' requirements.txt)
if ! ls .venv/wheelhouse/"numpy-${numpy_pin#numpy==}"-*.whl >/dev/null 2>&1; then
  .venv/bin/python -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps \
    -d .venv/wheelhouse "$numpy_pin"
fi
echo "[install_deps] done"
