"""The Hugging Face side of the interop tests: tiny random Llama models made and saved by
transformers, and their loss and greedy output as transformers computes them.

Exact fp64. transformers 5.23 loaded with dtype=float64 still computes two pieces in float32:
the rotary embedding (its inverse frequencies are a float32 buffer and the angles are formed in
float32) and RMSNorm (the mean of squares in float32). `fp64_exact` replaces the forward of both
on one model instance with float64 versions written here from the definitions:
  RoPE      ω_i = θ^(−2i/d), i < d/2, with Llama-3 scaling (for wavelength λ = 2π/ω and
            L = original_max_position_embeddings: λ < L/high → ω; λ > L/low → ω/factor; between,
            s = (L/λ − low)/(high − low) and ω' = (1 − s)·ω/factor + s·ω); the angle of
            position p is p·ω_i, and cos/sin are laid out [ω_0..ω_{d/2−1}, ω_0..ω_{d/2−1}]
            (rotate_half order).
  RMSNorm   y = w ⊙ x / sqrt(mean(x²) + ε).
Attention must go through SDPA, which accumulates in the input's type (the "eager" path takes
its softmax in float32), and the loss is the cross-entropy of the float64 logits computed here:
the model's own `labels=` loss upcasts the logits to float32 first.

Loss convention. polevault's window of T+1 tokens has inputs tokens[0:T] and targets
tokens[1:T+1]; HF's `labels=` shifts inside the model (logits[:-1] against labels[1:]). Both
functions below score the same T targets.
"""

import json
import math
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

VOCAB = 300
BOS, EOS = 1, 2
# GQA (4 query heads over 2 KV heads), untied, Llama-3 RoPE scaling whose three regimes all
# occur at head_dim 16 and θ = 10⁴: wavelengths 6.3 (< 64/4: kept), 19.9 and 62.8 (blended),
# 199 and above (> 64/1: divided by 8).
LLAMA3_SCALING = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


# initializer_range 0.25 rather than transformers' 0.02: at small scales a random model's greedy
# decoding falls into repeating one or two ids, which would test little of the decoding. At 0.25
# (seed 14, conftest; test_hf_checkpoints' prompt) the 40 greedy ids are 32 to 36 distinct ones,
# none of them EOS, each chosen by a top-2 logit margin of at least 2e-3, far above float32
# rounding (about 1e-5 here), so fp32's greedy ids are as well defined as fp64's.
def tiny_llama_config(**overrides):
    fields = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=dict(LLAMA3_SCALING),
        initializer_range=0.25, bos_token_id=BOS, eos_token_id=EOS,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def make_tiny_llama(seed, **overrides):
    """A random LlamaForCausalLM in float32. transformers initialises every RMSNorm weight to 1;
    they are drawn from [0.5, 1.5] here, so a norm weight loaded wrongly (or not at all) shows."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model.eval()


def rewrite_config_as_published(model_dir):
    """Rewrites config.json as checkpoints published before transformers 5 have it (what users
    download): `rope_theta` and `rope_scaling` at the top instead of `rope_parameters`,
    `torch_dtype` instead of `dtype`, and no `head_dim` (derived from hidden / heads)."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config["torch_dtype"] = config.pop("dtype")
    config.pop("head_dim")
    path.write_text(json.dumps(config, indent=2) + "\n")


def read_weights(model_dir):
    """name -> tensor of a directory's model weights (model.safetensors, or its shards
    model-0000k-of-0000N.safetensors merged), read by the safetensors package as stored."""
    tensors = {}
    files = sorted(Path(model_dir).glob("model.safetensors")) + sorted(Path(model_dir).glob("model-*-of-*.safetensors"))
    assert files, f"no model weights in {model_dir}"
    for file in files:
        for name, tensor in load_file(file).items():
            assert name not in tensors, f"{name} is stored twice in {model_dir}"
            tensors[name] = tensor
    return tensors


def load(model_dir, dtype):
    """from_pretrained as a user calls it; fails on any missing, unexpected or mismatched key."""
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="sdpa", output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers loaded {model_dir} with {problems}"
    return model.eval()


def _inverse_frequencies_fp64(config):
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    omega = [rope["rope_theta"] ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]
    if rope.get("rope_type", "default") == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        original = rope["original_max_position_embeddings"]
        scaled = []
        for w in omega:
            wavelength = 2 * math.pi / w
            if wavelength < original / high:
                scaled.append(w)
            elif wavelength > original / low:
                scaled.append(w / factor)
            else:
                s = (original / wavelength - low) / (high - low)
                scaled.append((1 - s) * w / factor + s * w)
        omega = scaled
    else:
        assert rope.get("rope_type", "default") == "default", f"no fp64 RoPE written for {rope}"
    return torch.tensor(omega, dtype=torch.float64)


def fp64_exact(model):
    """Makes a float64 model's RoPE and RMSNorm compute in float64 (see the top of the file)."""
    assert model.dtype == torch.float64 and model.config._attn_implementation == "sdpa"
    omega = _inverse_frequencies_fp64(model.config)

    def rope_forward(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * omega
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def rmsnorm_forward(self, x):
        x64 = x.to(torch.float64)
        y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.to(torch.float64) * y).to(x.dtype)

    model.model.rotary_emb.forward = types.MethodType(rope_forward, model.model.rotary_emb)
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    for norm in norms:
        norm.forward = types.MethodType(rmsnorm_forward, norm)
    return model


def load_fp64_exact(model_dir):
    return fp64_exact(load(model_dir, torch.float64))


@torch.no_grad()
def loss_fp64(model, tokens):
    """Mean cross-entropy of targets tokens[1:T+1] given inputs tokens[0:T], in float64."""
    ids = torch.tensor([tokens[:-1]])
    logits = model(input_ids=ids).logits[0].to(torch.float64)
    return F.cross_entropy(logits, torch.tensor(tokens[1:])).item()


@torch.no_grad()
def loss_hf(model, tokens):
    """transformers' own loss (labels=, computed in float32) on the same T targets: inputs are
    all T+1 tokens, and by causality the last position's logits (unscored) change nothing."""
    ids = torch.tensor([tokens])
    return model(input_ids=ids, labels=ids).loss.item()


@torch.no_grad()
def greedy_generate(model, prompt_ids, max_new_tokens):
    """model.generate(do_sample=False): the new ids only."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=model.config.eos_token_id,
    )
    return out[0, len(prompt_ids) :].tolist()
