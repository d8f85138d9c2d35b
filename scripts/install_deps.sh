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
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libboost-dev \
  python3 python3-pip python3-venv >/dev/null
# Python packages used by tests (reference tokenizers, jinja2, numpy for .npy checks, the routers
# of tests/server/test_routers.py: vllm-router and sglang-router), in a venv
# under the repository (.venv, made by Debian's python3): Debian refuses pip into the system Python
# (externally-managed-environment). scripts/build.sh hands the venv's python3 to ctest.
cd "$(dirname "$0")/.."
if ! .venv/bin/python3 -c "" 2>/dev/null; then
  /usr/bin/python3 -m venv --clear .venv
fi
.venv/bin/python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
