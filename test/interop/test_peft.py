"""LoRA adapters between polevault and Hugging Face PEFT, on the suite's tiny random Llama (GQA,
untied, Llama-3 RoPE scaling; conftest.hf_models, the fp32 copy, as the frozen base).

polevault into PEFT. `train --init-from BASE --lora-rank ...` runs 2 steps in fp64 at a learning
rate high enough that B is far from zero (the adapter changes the loss by much more than any
tolerance below), under two settings: all seven modules; and some of them (k_proj, o_proj,
gate_proj: parts of the fused q/k/v and gate/up linears only) with rsLoRA, dropout and another
rank and alpha. Then
  - the checkpoint's adapter_config.json is what PEFT's LoraConfig reads, with the run's settings,
    and no warning; its adapter_model.safetensors holds exactly the tensor names and shapes PEFT's
    own get_peft_model gives for those settings;
  - PeftModel.from_pretrained(base, checkpoint) holds exactly the file's adapter tensors and gives
    the loss `train eval` gives: fp64 to 1e-12 (transformers made exactly fp64:
    hf_reference.fp64_exact), fp32 to 1e-5 relative;
  - `train export CKPT --peft OUT` is the same adapter (same tensors, config), loading the same way;
  - `train export CKPT --merged OUT` is a plain Hugging Face model that transformers loads with no
    missing or unexpected key, whose targeted weights are W + s·B·A (computed here from the base
    and the adapter files, s = alpha/r or alpha/√r), every other tensor the base's, and whose loss
    is `train eval`'s (fp64 1e-12, fp32 1e-5).

PEFT into polevault. get_peft_model on the same base (q_proj, v_proj, o_proj, up_proj, down_proj:
fused linears targeted in part, rsLoRA), B set to random values so that the adapter matters, saved
with save_pretrained. `train --init-from BASE --adapter DIR` at learning rate 0 writes back exactly
the adapter tensors it read, and `train eval` of that checkpoint gives PEFT's loss (fp64 1e-12,
fp32 1e-5); trained on for 2 steps, PEFT loads the result and agrees with `train eval` again.
"""

import math
import warnings

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file

import hf_reference as hf
import polevault_cli as pv

BASE = "fp32-published-config"  # conftest.hf_models
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
PREFIX = "base_model.model."  # PEFT's key = PREFIX + the module's name in the base + ".lora_A.weight"
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name -> (train flags, the PEFT settings they mean)
RUNS = {
    "all-seven": (
        ["--lora-rank", 4, "--lora-alpha", 8],
        dict(r=4, lora_alpha=8, use_rslora=False, lora_dropout=0.0, target_modules=set(SEVEN)),
    ),
    "some-rslora-dropout": (
        ["--lora-rank", 2, "--lora-alpha", 6, "--rslora", "--lora-targets", "k_proj,o_proj,gate_proj",
         "--lora-dropout", 0.1],
        dict(r=2, lora_alpha=6, use_rslora=True, lora_dropout=0.1, target_modules={"k_proj", "o_proj", "gate_proj"}),
    ),
}


def relative(a, b):
    return abs(a - b) / abs(b)


def scale(settings):
    r, alpha = settings["r"], settings["lora_alpha"]
    return alpha / math.sqrt(r) if settings["use_rslora"] else alpha / r


@pytest.fixture(scope="module")
def train_shard(tmp_path_factory):
    tokens = pv.random_tokens(4000, seed=17, vocab=hf.VOCAB)
    return pv.write_shard(tmp_path_factory.mktemp("train") / "train.pvtokens", tokens, hf.VOCAB, hf.EOS)


def train(base, data, out_dir, steps, lr, *flags):
    """`train --init-from BASE` in fp64 with `flags`; the last checkpoint's directory."""
    pv.run_train(
        "--init-from", base, "--data", data, "--val-data", data, "--dtype", "fp64", "--steps", steps, "--lr", lr,
        "--warmup", 0, "--batch", 2, "--seq-len", 32, "--eval-interval", 0, "--sample-tokens", 0,
        "--out-dir", out_dir, *flags,
    )
    checkpoint = out_dir / f"step_{steps}"
    assert (checkpoint / ADAPTER_FILE).exists(), f"no LoRA checkpoint at {checkpoint}"
    return checkpoint


def peft_model(base, adapter_dir, dtype):
    """PeftModel.from_pretrained as a user calls it, on the base in `dtype` (float64: made exact);
    fails on any warning PEFT gives while loading (missing or unexpected keys, unknown config keys)."""
    model = hf.load_fp64_exact(base) if dtype == torch.float64 else hf.load(base, dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(model, adapter_dir)
    # transformers' own deprecation notices (is_gradient_checkpointing) are not about the adapter.
    problems = [str(w.message) for w in caught if not issubclass(w.category, FutureWarning)]
    assert not problems, f"PEFT warned while loading {adapter_dir}: {problems}"
    return model.eval()


def check_holds_the_file(model, adapter_dir):
    """Every adapter tensor in the PeftModel equals the file's, and every one in the file is used."""
    stored = load_file(adapter_dir / ADAPTER_FILE)
    held = {name: t for name, t in get_peft_model_state_dict(model).items()}
    assert sorted(held) == sorted(stored)
    for name, tensor in stored.items():
        assert torch.equal(held[name], tensor.to(held[name].dtype)), f"PEFT holds another {name} than the file"


def check_losses(base, adapter_dir, polevault_model_dir, window):
    """PEFT's loss of base + adapter equals `train eval` of polevault_model_dir (fp64 and fp32)."""
    expected = hf.loss_fp64(peft_model(base, adapter_dir, torch.float64), window["tokens"])
    got = pv.evaluate(polevault_model_dir, window["path"], "fp64", window["seq_len"])
    assert got["tokens"] == window["seq_len"] and got["windows"] == 1, got
    assert relative(got["loss"], expected) <= 1e-12, (got["loss"], expected)

    expected32 = hf.loss_hf(peft_model(base, adapter_dir, torch.float32), window["tokens"])
    got32 = pv.evaluate(polevault_model_dir, window["path"], "fp32", window["seq_len"])
    assert relative(got32["loss"], expected32) <= 1e-5, (got32["loss"], expected32)
    return expected


def check_adapter_matters(base, loss, window):
    """The adapter moves the loss far beyond the tolerances: a dropped or zero adapter shows."""
    base_loss = hf.loss_fp64(hf.load_fp64_exact(base), window["tokens"])
    assert relative(loss, base_loss) > 1e-4, (loss, base_loss)


# --- polevault into PEFT ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(RUNS))
def lora_run(request, hf_models, train_shard, tmp_path_factory):
    """(settings, checkpoint) of a 2-step LoRA run on the base."""
    flags, settings = RUNS[request.param]
    checkpoint = train(hf_models[BASE], train_shard, tmp_path_factory.mktemp(request.param), 2, 1e-2, *flags)
    return settings, checkpoint


def check_peft_reads_the_config(adapter_dir, settings, base):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = LoraConfig.from_pretrained(adapter_dir)
    assert not caught, [str(w.message) for w in caught]
    for key, value in settings.items():
        assert getattr(config, key) == value, (key, getattr(config, key), value)
    assert config.peft_type == "LORA" and config.task_type == "CAUSAL_LM"
    assert config.base_model_name_or_path == str(base)


def test_checkpoint_is_a_peft_adapter(lora_run, hf_models):
    settings, checkpoint = lora_run
    check_peft_reads_the_config(checkpoint, settings, hf_models[BASE])
    # The tensor names and shapes PEFT itself gives the same settings on the same base.
    peft_own = get_peft_model(hf.load(hf_models[BASE], torch.float64), LoraConfig(**settings, task_type="CAUSAL_LM"))
    expected = {name: t.shape for name, t in get_peft_model_state_dict(peft_own).items()}
    stored = load_file(checkpoint / ADAPTER_FILE)
    assert {name: t.shape for name, t in stored.items()} == expected
    b = [t for name, t in stored.items() if ".lora_B." in name]
    assert all(t.abs().max() > 0 for t in b), "a B matrix is still zero after training"


def test_peft_loads_the_checkpoint_with_polevaults_loss(lora_run, hf_models, eval_window):
    _, checkpoint = lora_run
    base = hf_models[BASE]
    check_holds_the_file(peft_model(base, checkpoint, torch.float64), checkpoint)
    loss = check_losses(base, checkpoint, checkpoint, eval_window)
    check_adapter_matters(base, loss, eval_window)


def test_export_peft_is_the_same_adapter(lora_run, hf_models, eval_window, tmp_path):
    settings, checkpoint = lora_run
    base, exported = hf_models[BASE], tmp_path / "peft"
    pv.run_train("export", checkpoint, "--peft", exported)
    check_peft_reads_the_config(exported, settings, base)
    stored, written = load_file(checkpoint / ADAPTER_FILE), load_file(exported / ADAPTER_FILE)
    assert sorted(written) == sorted(stored)
    for name, tensor in stored.items():
        assert torch.equal(written[name], tensor), f"export --peft changed {name}"
    check_holds_the_file(peft_model(base, exported, torch.float64), exported)
    check_losses(base, exported, checkpoint, eval_window)


# How close a merged weight stored in each type must be to W + s·B·A computed in float64: half an
# ulp of the type, relative to the largest weight of the matrix (a few ulps of slack).
MERGE_TOLERANCE = {torch.float64: 1e-14, torch.float32: 3e-7, torch.bfloat16: 1e-2}


def test_export_merged_is_the_base_plus_s_b_a(lora_run, hf_models, eval_window, tmp_path):
    settings, checkpoint = lora_run
    base, merged = hf_models[BASE], tmp_path / "merged"
    pv.run_train("export", checkpoint, "--merged", merged)
    hf.load(merged, "auto")  # no missing, unexpected or mismatched key: a plain Llama, no adapter
    written, original = hf.read_weights(merged), hf.read_weights(base)
    adapter = load_file(checkpoint / ADAPTER_FILE)
    assert sorted(written) == sorted(original)
    targeted = set()
    for name, a in adapter.items():
        if ".lora_A." not in name:
            continue
        weight = name[len(PREFIX):].replace(".lora_A.weight", ".weight")
        b = adapter[name.replace(".lora_A.", ".lora_B.")]
        expected = original[weight].double() + scale(settings) * (b.double() @ a.double())
        got = written[weight]
        error = (got.double() - expected).abs().max() / expected.abs().max()
        assert error <= MERGE_TOLERANCE[got.dtype], (weight, got.dtype, error.item())
        targeted.add(weight)
    assert len(targeted) == len(settings["target_modules"]) * hf.tiny_llama_config().num_hidden_layers
    for name, tensor in original.items():
        if name not in targeted:
            assert torch.equal(written[name].double(), tensor.double()), f"export --merged changed {name}"

    expected = hf.loss_fp64(hf.load_fp64_exact(merged), eval_window["tokens"])
    got = pv.evaluate(checkpoint, eval_window["path"], "fp64", eval_window["seq_len"])["loss"]
    assert relative(got, expected) <= 1e-12, (got, expected)
    expected32 = hf.loss_hf(hf.load(merged, torch.float32), eval_window["tokens"])
    got32 = pv.evaluate(checkpoint, eval_window["path"], "fp32", eval_window["seq_len"])["loss"]
    assert relative(got32, expected32) <= 1e-5, (got32, expected32)


# --- PEFT into polevault ----------------------------------------------------------------------

PEFT_MADE = dict(r=4, lora_alpha=4, use_rslora=True, lora_dropout=0.0,
                 target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])


@pytest.fixture(scope="module")
def peft_adapter(hf_models, tmp_path_factory):
    """An adapter made and saved by PEFT on the base, its B matrices random (PEFT starts them at 0)."""
    model = get_peft_model(hf.load(hf_models[BASE], torch.float32), LoraConfig(**PEFT_MADE, task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(23)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    directory = tmp_path_factory.mktemp("peft-made")
    model.save_pretrained(directory)
    assert (directory / ADAPTER_FILE).exists() and (directory / CONFIG_FILE).exists()
    return directory


def test_peft_made_adapter_loads_into_polevault(hf_models, peft_adapter, train_shard, eval_window, tmp_path):
    base = hf_models[BASE]
    # Learning rate 0: the adapter written back is exactly the one read (fp32 in the file, fp64 in
    # the run: widening is exact), and the checkpoint's loss is PEFT's.
    checkpoint = train(base, train_shard, tmp_path / "lr0", 1, 0, "--adapter", peft_adapter)
    original, written = load_file(peft_adapter / ADAPTER_FILE), load_file(checkpoint / ADAPTER_FILE)
    assert sorted(written) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(written[name].double(), tensor.double()), f"{name} changed through --adapter at lr 0"
    loss = check_losses(base, peft_adapter, checkpoint, eval_window)
    check_adapter_matters(base, loss, eval_window)

    # Trained on, the adapter is still PEFT's: PEFT loads it and agrees with `train eval`.
    trained = train(base, train_shard, tmp_path / "trained", 2, 1e-2, "--adapter", peft_adapter)
    settings = dict(PEFT_MADE, target_modules=set(PEFT_MADE["target_modules"]))
    check_peft_reads_the_config(trained, settings, base)
    moved = load_file(trained / ADAPTER_FILE)
    assert any(not torch.equal(moved[n].double(), t.double()) for n, t in original.items()), "nothing trained"
    check_holds_the_file(peft_model(base, trained, torch.float64), trained)
    check_losses(base, trained, trained, eval_window)
