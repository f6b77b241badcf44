"""polevault checkpoints into Hugging Face: a model trained by `train` for a few steps (GQA,
untied, Llama-3 RoPE scaling; bf16 and fp32 runs), and its `train export`, load with
`AutoModelForCausalLM.from_pretrained` with no missing, unexpected or mismatched key, hold exactly
the weights polevault wrote, and give the loss `train eval` gives on the same tokens (fp64 to
1e-12 with transformers run exactly in float64, fp32 to 1e-6). The run's tokenizer (trained by
polevault on its built-in corpus) encodes the same ids in the `tokenizers` package and through
the exported directory's AutoTokenizer as in `train tokenize`.
"""

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

import hf_reference as hf
import polevault_cli as pv

SEQ_LEN = 32
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TEXTS = [
    "The kernel launches one block per row.",
    "  two leading spaces, a tab\there, and a newline\n",
    "numbers 1234567 and 3.14159; code: for (int i = 0; i < n; ++i) x[i] *= 2;",
    "Grüße, naïve café — ünïcödé and 日本語 and emoji 🚀",
]


@pytest.fixture(scope="module")
def shape_config(tmp_path_factory):
    """The model's shape as a config.json in the form published checkpoints use."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": hf.VOCAB, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": dict(hf.LLAMA3_SCALING),
        "tie_word_embeddings": False,
    }
    directory = tmp_path_factory.mktemp("shape")
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


@pytest.fixture(scope="module", params=["bf16", "fp32"])
def trained(request, shape_config, tmp_path_factory):
    """(dtype, step_3 directory) of a 3-step run on the built-in corpus with a 300-token
    tokenizer trained on it."""
    dtype = request.param
    out_dir = tmp_path_factory.mktemp(f"run-{dtype}")
    pv.run_train(
        "--config", shape_config / "config.json", "--vocab", hf.VOCAB, "--dtype", dtype, "--steps", 3,
        "--warmup", 1, "--batch", 4, "--seq-len", SEQ_LEN, "--eval-interval", 0, "--sample-tokens", 0,
        "--out-dir", out_dir,
    )
    checkpoint = out_dir / "step_3"
    assert (checkpoint / "model.safetensors").exists(), f"no checkpoint at {checkpoint}"
    return dtype, checkpoint


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    tokens = pv.random_tokens(SEQ_LEN + 1, seed=11, vocab=hf.VOCAB)
    path = pv.write_shard(tmp_path_factory.mktemp("window") / "window.pvtokens", tokens, hf.VOCAB, 0)
    return {"path": path, "tokens": tokens, "seq_len": SEQ_LEN}


def check_holds_the_written_weights(model, model_dir, torch_dtype):
    stored = hf.read_weights(model_dir)
    state = model.state_dict()
    assert sorted(state) == sorted(stored)
    for name, tensor in stored.items():
        assert tensor.dtype == torch_dtype, (name, tensor.dtype)
        assert torch.equal(state[name], tensor), f"transformers holds another {name} than {model_dir} stores"


def check_loss(model_dir, window):
    expected = hf.loss_fp64(hf.load_fp64_exact(model_dir), window["tokens"])
    got = pv.evaluate(model_dir, window["path"], "fp64", window["seq_len"])
    assert got["tokens"] == SEQ_LEN and got["windows"] == 1, got
    assert abs(got["loss"] - expected) <= 1e-12 * expected, (got["loss"], expected)

    expected = hf.loss_hf(hf.load(model_dir, torch.float32), window["tokens"])
    got = pv.evaluate(model_dir, window["path"], "fp32", window["seq_len"])
    assert abs(got["loss"] - expected) <= 1e-6 * expected, (got["loss"], expected)


def test_checkpoint_loads_in_transformers(trained, shape_config):
    dtype, checkpoint = trained
    model = hf.load(checkpoint, "auto")  # the dtype config.json names
    assert model.dtype == TORCH_DTYPES[dtype]
    check_holds_the_written_weights(model, checkpoint, TORCH_DTYPES[dtype])
    got, expected = AutoConfig.from_pretrained(checkpoint), AutoConfig.from_pretrained(shape_config)
    for field in ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings"]:
        assert getattr(got, field) == getattr(expected, field), field


def test_checkpoint_loss_equals_train_eval(trained, window):
    check_loss(trained[1], window)


def test_checkpoint_tokenizer_encodes_as_tokenizers_does(trained):
    tokenizer_file = trained[1] / "tokenizer.json"
    reference = Tokenizer.from_file(str(tokenizer_file))
    for text in TEXTS:
        assert pv.tokenize(tokenizer_file, text) == reference.encode(text, add_special_tokens=False).ids, text


def test_export_loads_in_transformers(trained, window, tmp_path):
    dtype, checkpoint = trained
    exported = tmp_path / "exported"
    pv.run_train("export", checkpoint, "--out", exported)
    model = hf.load(exported, "auto")
    assert model.dtype == TORCH_DTYPES[dtype]
    check_holds_the_written_weights(model, exported, TORCH_DTYPES[dtype])
    stored, exported_weights = hf.read_weights(checkpoint), hf.read_weights(exported)
    assert sorted(exported_weights) == sorted(stored)
    assert all(torch.equal(exported_weights[n], t) for n, t in stored.items()), "export changed the weights"
    check_loss(exported, window)

    GenerationConfig.from_pretrained(exported)  # generation_config.json is there and valid
    reference = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokenizer = AutoTokenizer.from_pretrained(exported)
    for text in TEXTS:
        expected = reference.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text
