"""Writes test/data/peft/*.json: adapter_config.json files as PEFT itself writes them, which
test/test_peft_config.cpp reads (formats/peft_config.h) and compares polevault's own files with.

    test/interop/run.sh build/interop-venv --co -q     # once, to create the pinned environment
    PYTHONPATH=test/interop build/interop-venv/bin/python test/interop/make_peft_config_fixtures.py
(with run.sh's LD_LIBRARY_PATH for torch; the script re-runs itself with PYTHONHASHSEED=0, as PEFT
saves target_modules from a Python set, whose order follows string hashing: a fixed seed makes the
files reproducible, still in PEFT's unsorted order.)

Each file is what the PEFT of requirements.txt saves for the settings given here, which the C++
test states again as its expected values:
  q_v.json            get_peft_model on a tiny Llama named "polevault/tiny-llama": r 4, lora_alpha 8,
                      target_modules ["q_proj", "v_proj"], task_type CAUSAL_LM (PEFT's defaults else)
  all_linear_rslora.json  the same with r 8, lora_alpha 16, lora_dropout 0.05, use_rslora,
                      target_modules "all-linear" (PEFT resolves it to the seven module names)
  config_all_linear.json  LoraConfig(r 16, lora_alpha 32, target_modules "all-linear",
                      task_type CAUSAL_LM).save_pretrained: the string kept as written
  regex.json          LoraConfig(target_modules=r".*\\.(q|v)_proj") saved: refused
  dora.json           q_v's settings with use_dora: refused
  pissa.json          q_v's settings with init_lora_weights "pissa": refused
  layers.json         q_v's settings with layers_to_transform [0, 2]: refused
"""

import json
import os
import sys
import tempfile
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import peft  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

import hf_reference as hf  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "data" / "peft"
BASE_NAME = "polevault/tiny-llama"
Q_V = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def saved_by_model(config):
    """adapter_config.json as PeftModel.save_pretrained writes it for a tiny Llama."""
    model = hf.make_tiny_llama(seed=3)
    model.name_or_path = BASE_NAME
    with tempfile.TemporaryDirectory() as directory:
        get_peft_model(model, config).save_pretrained(directory)
        return (Path(directory) / "adapter_config.json").read_text()


def saved_by_config(config):
    """adapter_config.json as LoraConfig.save_pretrained writes it (no model: nothing resolved)."""
    with tempfile.TemporaryDirectory() as directory:
        config.save_pretrained(directory)
        return (Path(directory) / "adapter_config.json").read_text()


def main():
    files = {
        "q_v.json": saved_by_model(LoraConfig(**Q_V)),
        "all_linear_rslora.json": saved_by_model(
            LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, use_rslora=True, target_modules="all-linear",
                       task_type="CAUSAL_LM")),
        "config_all_linear.json": saved_by_config(
            LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")),
        "regex.json": saved_by_config(LoraConfig(target_modules=r".*\.(q|v)_proj", task_type="CAUSAL_LM")),
        "dora.json": saved_by_config(LoraConfig(**Q_V, use_dora=True)),
        "pissa.json": saved_by_config(LoraConfig(**Q_V, init_lora_weights="pissa")),
        "layers.json": saved_by_config(LoraConfig(**Q_V, layers_to_transform=[0, 2])),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        assert json.loads(text)["peft_version"] == peft.__version__
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
