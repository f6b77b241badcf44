#!/usr/bin/env bash
# `make test-interop`: the interop suite (test/interop/test_*.py) in its own virtual environment.
#
#   test/interop/run.sh VENV [pytest arguments]
#
# Creates VENV from requirements.txt unless VENV already holds that set (a stamp named after the
# file's hash: editing it rebuilds the environment, nothing else does), then runs pytest on
# test/interop/ against build/host/train ($POLEVAULT_TRAIN overrides). The suite's last line is
# `N passed, M failed` (conftest.py), as .ci/run aggregates.
#
# torch: requirements.txt explains why it is installed without its CUDA wheels; what it still
# loads comes from the four nvidia-* wheels' lib/ folders and /usr/local/cuda/lib64, which
# LD_LIBRARY_PATH names here (the loader reads it at process start, so it is set before Python).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:?usage: test/interop/run.sh VENV [pytest arguments]}"
shift

# Nothing from the network (the models are made by the tests), no caches written into the
# source tree, and no progress bars or deprecation chatter in the output.
export HF_HUB_OFFLINE=1 HF_HOME="$PWD/build/interop-hf-home" TRANSFORMERS_VERBOSITY=error \
  HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONPYCACHEPREFIX="$PWD/build/interop-pycache"

key=$(sha256sum < test/interop/requirements.txt | cut -c1-16)
stamp="$venv/installed-$key"
if [[ ! -f $stamp ]]; then
  echo "interop: creating $venv (the pinned set of test/interop/requirements.txt)"
  start=$(date +%s)
  rm -rf "$venv"
  python3 -m venv "$venv" ||
    { echo "interop: python3 -m venv failed: install Python 3 with its venv module (Debian: python3-venv)"; exit 1; }
  # uv (pinned in the file) installs the set: it downloads and unpacks the wheels in parallel
  # (the environment, with the import check below, took 28-31 s here, where pip made it in
  # 45-46 s: the "created in" line). --no-deps: the file is the complete set (a resolver
  # would otherwise add torch's CUDA wheels). Nothing is byte-compiled at install time; Python
  # compiles what the suite imports on first use (into build/, PYTHONPYCACHEPREFIX above).
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-compile \
    "$(grep -E '^uv==' test/interop/requirements.txt)"
  UV_CACHE_DIR="$PWD/build/interop-uv-cache" UV_PYTHON_DOWNLOADS=never "$venv/bin/uv" pip install --quiet \
    --no-deps --python "$venv/bin/python" -r test/interop/requirements.txt
fi

libs=$(find "$PWD/$venv" -path '*/site-packages/nvidia/*/lib' -type d | sort | paste -sd: -)
export LD_LIBRARY_PATH="$libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -f $stamp ]]; then
  "$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, peft, bitsandbytes, pytest' ||
    { echo "interop: $venv does not import its packages (above); fix test/interop/requirements.txt"; exit 1; }
  touch "$stamp"
  echo "interop: $venv created in $(( $(date +%s) - start ))s"
fi

export POLEVAULT_TRAIN="${POLEVAULT_TRAIN:-$PWD/build/host/train}"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfE test/interop "$@"
