#!/usr/bin/env python3
"""Makes test/data/bnb/: a tiny Llama model and the bitsandbytes 4-bit checkpoints transformers
itself saves of it, for test/test_bnb_checkpoint.cu (polevault reading pre-quantised checkpoints).

  dense/    config.json + model.safetensors: the model in bf16 (seeded N(0, 0.02^2) weights)
  nf4_dq/   the same model loaded with BitsAndBytesConfig(load_in_4bit, nf4, double quant) and
            saved with save_pretrained: every block linear as packed codes + absmax + nested
            fields + quant_state JSON, config.json with its quantization_config
  nf4/      the same without double quantisation (absmax F32)

The shape is chosen for awkward NF4 sizes: k_proj and v_proj hold 24x72 = 1728 elements (27
blocks of 64), the MLP linears 236x72 = 16992 (265.5 blocks: a short last block, and 266 blocks
= 2 nested blocks of 256 with double quantisation). bitsandbytes quantises on the CPU here (its
CPU path; kernels/nf4.cuh lists where it differs from the CUDA kernels).

Run with the interop venv plus bitsandbytes and accelerate:
  python test/interop/make_bnb_checkpoint_fixtures.py test/data/bnb
"""
import os
import shutil
import sys

import torch
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM


def main(out):
    torch.manual_seed(14)
    config = LlamaConfig(vocab_size=64, hidden_size=72, intermediate_size=236, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=64, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # norms away from 1 so that a mix-up shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    shutil.rmtree(out, ignore_errors=True)
    dense = os.path.join(out, "dense")
    model.save_pretrained(dense)
    for name, double_quant in (("nf4_dq", True), ("nf4", False)):
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=double_quant,
                                          bnb_4bit_compute_dtype=torch.float32)
        q = LlamaForCausalLM.from_pretrained(dense, quantization_config=quantization, dtype=torch.bfloat16,
                                             device_map="cpu")
        q.save_pretrained(os.path.join(out, name))
    for d in ("dense", "nf4_dq", "nf4"):
        print(d, sorted(os.listdir(os.path.join(out, d))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "test/data/bnb")
