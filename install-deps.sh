#!/usr/bin/env bash
# Installs the Debian packages polevault needs to build and test (as root, or with sudo).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) comes with the machine image, not from here.
#
#   catch2             Catch2 v2, the test framework
#   libopenblas-dev    the host backend's GEMM
#   libopenmpi-dev, openmpi-bin   launch and host collectives (multi-rank tests, NCCL on MPI)
#   nlohmann-json3-dev config.json, safetensors headers, tokenizer.json
#   libcli11-dev       the command line
#   libyaml-cpp-dev    run files (train --run run.yaml)
#   libpcre2-dev       the tokenizer's Unicode pre-split
#   gnuplot-nox        `train plot` draws its PNG with it (pngcairo terminal)
#   libxxhash-dev      XXH3 checksums of checkpoint files and token shards
#   python3, python3-venv   make test-interop's virtual environment (test only; PyPI packages go there)
#   make, g++          the build
#   ccache             the compiler cache every compile goes through (Makefile, "Compiler cache")
#   clang, libclang-rt-14-dev   make fuzz: libFuzzer and the sanitizers' runtimes for clang
set -euo pipefail
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
  make g++ catch2 libopenblas-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libpcre2-dev \
  libxxhash-dev gnuplot-nox python3 python3-venv clang libclang-rt-14-dev ccache
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "note: nvcc not found; BACKEND=cuda builds need the CUDA toolkit (the host backend does not)" >&2
fi
