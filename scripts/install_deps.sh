#!/usr/bin/env bash
# Installs what Fathom needs to build and test on a fresh Debian 12 machine.
# The CUDA toolkit is optional: without nvcc the CUDA backend is simply not built.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git \
  clang libclang-rt-dev \
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev \
  python3 python3-pip python3-venv >/dev/null
# Python packages used by tests (reference tokenizers, jinja2, numpy for .npy checks).
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"
