"""bitsandbytes 4-bit (NF4) checkpoints between transformers and polevault, on the suite's tiny
random Llama (conftest.hf_models, the fp32 copy). bitsandbytes 0.50.2 quantises and runs on the
CPU here.

transformers into polevault. from_pretrained(BASE, BitsAndBytesConfig(load_in_4bit, nf4, double
quantisation)) then save_pretrained writes a pre-quantised checkpoint. `train --init-from` it with
`--lora-rank 2 --quantize nf4` at learning rate 0 (B stays 0, so the model is the 4-bit base) and
`train eval` of the checkpoint give the loss transformers' 4-bit model gives (fp32, 1e-5 relative:
the same dequantised weights, other GEMMs; the model has intermediate_size 128, see INTERMEDIATE). Without --quantize nf4, or with --no-double-quant, the
run is refused naming the flag.

polevault into transformers. A QLoRA run trained 2 steps (B far from zero) is exported twice:
`--merged` (dense fp32) and `--merged --quantized`. The quantized directory loads with
from_pretrained with no missing or unexpected key as a 4-bit model (every block linear a
Linear4bit); its tensors are what bitsandbytes' own quantize_4bit makes of the dense export's
weights (codes bit for bit; the offset, the mean of the absmaxes, within an ulp of torch's
CPU mean, and the nested absmaxes with it; the 8-bit absmax codes at most one step apart, where
bitsandbytes' CPU table lookup is not the nearest entry, kernels/nf4.cuh); and its
loss is the dense model's with every linear replaced by bitsandbytes' dequantisation of the
exported tensors (fp32, 1e-5).
"""

import json
import subprocess

import pytest
import torch
import bitsandbytes.functional as bnbf
from bitsandbytes.nn import Linear4bit
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import hf_reference as hf
import polevault_cli as pv

BASE = "fp32-published-config"  # conftest.hf_models
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]
STATE = ".quant_state.bitsandbytes__nf4"
# bitsandbytes 0.50.2's CPU dequantize_4bit is wrong for a weight whose last dimension is not a
# multiple of 64 (measured: [64, 160] dequantises up to 2.08 away from its own codes and absmaxes
# read as the format says, [160, 64] exactly), so every in_features here is a multiple of 64:
# hidden 64, intermediate 128 (conftest's model has 160).
INTERMEDIATE = 128


def relative(a, b):
    return abs(a - b) / abs(b)


def ulp(x):
    x = torch.as_tensor(x, dtype=torch.float32).abs()
    return (torch.nextafter(x, torch.tensor(float("inf"))) - x).item()


def block_linears(config):
    return [f"model.layers.{l}.{m}.weight" for l in range(config.num_hidden_layers) for m in LINEARS]


def load_4bit(model_dir):
    """from_pretrained of a pre-quantised directory: no missing, unexpected or mismatched key, and
    every block linear a bitsandbytes Linear4bit."""
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, device_map="cpu", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers loaded {model_dir} with {problems}"
    for name in block_linears(model.config):
        module = model.get_submodule(name[: -len(".weight")])
        assert isinstance(module, Linear4bit), f"{name} loaded as {type(module).__name__}, not Linear4bit"
        # On a CPU with AVX512-BF16 bitsandbytes repacks the weights on the first forward into a
        # kernel of its own that rounds the absmaxes to bf16 (and needs in_features % 64 == 0);
        # its generic path dequantises in fp32 (dequantize_4bit) and multiplies, as polevault does.
        module.support_avx512bf16_for_cpu = False
    return model.eval()


@pytest.fixture(scope="module")
def bnb_base(tmp_path_factory):
    """The suite's tiny Llama with intermediate_size 128 (see the top), saved by transformers in fp32,
    then loaded as a 4-bit model (double quantisation) and saved pre-quantised."""
    root = tmp_path_factory.mktemp("bnb")
    hf.make_tiny_llama(seed=14, intermediate_size=INTERMEDIATE).save_pretrained(root / "dense")
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(root / "dense", quantization_config=quantization,
                                                 dtype=torch.float32, device_map="cpu")
    model.save_pretrained(root / "nf4-dq")
    assert (root / "nf4-dq" / "model.safetensors").exists()
    return root / "nf4-dq"


def qlora_run(base, data, out_dir, steps, lr, *flags):
    pv.run_train(
        "--init-from", base, "--data", data, "--dtype", "fp32", "--steps", steps, "--lr", lr, "--warmup", 0,
        "--batch", 1, "--seq-len", 48, "--eval-interval", 0, "--sample-tokens", 0, "--out-dir", out_dir,
        "--lora-rank", 2, "--lora-alpha", 4, *flags,
    )
    return out_dir / f"step_{steps}"


def test_polevault_reads_a_transformers_4bit_checkpoint(bnb_base, eval_window, tmp_path):
    checkpoint = qlora_run(bnb_base, eval_window["path"], tmp_path / "run", 1, 0, "--quantize", "nf4")
    ours = pv.evaluate(checkpoint, eval_window["path"], "fp32", eval_window["seq_len"])["loss"]
    theirs = hf.loss_hf(load_4bit(bnb_base), eval_window["tokens"])
    assert relative(ours, theirs) <= 1e-5, f"polevault {ours} vs transformers' 4-bit model {theirs}"


@pytest.mark.parametrize("flags, fix", [([], "--quantize nf4"), (["--quantize", "nf4", "--no-double-quant"],
                                                                 "pass --double-quant")])
def test_a_4bit_checkpoint_is_refused_without_the_flags_that_keep_it(bnb_base, eval_window, tmp_path, flags, fix):
    command = [pv.TRAIN, "--init-from", bnb_base, "--data", eval_window["path"], "--steps", 1, "--warmup", 0, "--batch", 1,
               "--seq-len", 48, "--out-dir", tmp_path / "run", "--lora-rank", 2, *flags]
    done = subprocess.run([str(c) for c in command], capture_output=True, timeout=120)
    assert done.returncode != 0
    assert fix in done.stderr.decode(), done.stderr.decode()
    assert not (tmp_path / "run" / "step_1").exists()


def test_export_quantized_is_what_bitsandbytes_makes(bnb_base, eval_window, tmp_path):
    checkpoint = qlora_run(bnb_base, eval_window["path"], tmp_path / "run", 2, 0.05, "--quantize", "nf4")
    dense_dir, quantized_dir = tmp_path / "merged", tmp_path / "quantized"
    pv.run_train("export", checkpoint, "--merged", dense_dir)
    pv.run_train("export", checkpoint, "--merged", quantized_dir, "--quantized")
    config = json.loads((quantized_dir / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "bitsandbytes" and config["load_in_4bit"]
    assert config["bnb_4bit_quant_type"] == "nf4" and config["bnb_4bit_use_double_quant"]

    dense, ours = load_file(dense_dir / "model.safetensors"), load_file(quantized_dir / "model.safetensors")
    linears = block_linears(hf.tiny_llama_config(intermediate_size=INTERMEDIATE))
    expected = set(dense) | {n + s for n in linears for s in
                             [".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", STATE]}
    assert set(ours) == expected
    moved = 0
    for name in linears:
        w = dense[name]
        packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
        assert torch.equal(ours[name], packed), f"{name}: codes differ from bitsandbytes'"
        assert torch.equal(ours[name + ".quant_map"], state.code)
        assert torch.equal(ours[name + ".nested_quant_map"], state.state2.code)
        quant_state = json.loads(bytes(ours[name + STATE].tolist()).decode())
        assert quant_state["shape"] == list(w.shape) and quant_state["dtype"] == "float32"
        # The offset is the mean of the absmaxes: polevault's is the correctly rounded mean, torch's
        # CPU mean (a float32 cascade) can be one ulp away; the nested fields follow from it.
        offset = torch.tensor(quant_state["nested_offset"], dtype=torch.float32)
        assert abs(offset - state.offset) <= ulp(state.offset), f"{name}: offset {offset} vs {state.offset}"
        nested = ours[name + ".nested_absmax"]
        # nested = max |absmax - offset|: it moves with the offset, by up to an ulp of each.
        bound = ulp(state.offset) + ulp(state.state2.absmax.abs().max())
        assert (nested - state.state2.absmax).abs().max() <= bound, f"{name}: nested absmax"
        steps = (ours[name + ".absmax"].int() - state.absmax.int()).abs()
        assert steps.max() <= 1, f"{name}: absmax codes more than one step from bitsandbytes'"
        moved += int((steps != 0).sum())
        # polevault's merged weights really moved away from the base (B is not zero).
        assert not torch.equal(w, bnbf.dequantize_4bit(packed, state))
    assert moved * 50 <= sum(ours[n + ".absmax"].numel() for n in linears)

    # transformers computes with exactly what bitsandbytes dequantises from the exported tensors.
    model = load_4bit(quantized_dir)
    reference = hf.load(dense_dir, torch.float32)
    with torch.no_grad():
        for name in linears:
            module = model.get_submodule(name[: -len(".weight")])
            weight = bnbf.dequantize_4bit(module.weight.data, module.weight.quant_state).to(torch.float32)
            reference.get_submodule(name[: -len(".weight")]).weight.copy_(weight)
    theirs, expected_loss = hf.loss_hf(model, eval_window["tokens"]), hf.loss_hf(reference, eval_window["tokens"])
    assert relative(theirs, expected_loss) <= 1e-5, f"4-bit model {theirs} vs its dequantised weights {expected_loss}"
