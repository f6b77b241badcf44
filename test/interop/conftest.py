"""Shared fixtures of the interop suite, and its closing line.

The models are made here, once per session, by the libraries under test: a tiny random Llama
saved by transformers in the two ways checkpoints come (bf16 sharded with the config.json
transformers 5 writes; fp32 in one file with the config.json of published checkpoints), and
token windows to score them on.

The suite ends with `N passed, M failed` alone on the last line (tests whose setup or teardown
failed, and files that failed to collect, count as failed), as .ci/run adds up every suite.
"""

import pytest
import torch

import hf_reference as hf
import polevault_cli as pv


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """name -> directory of the same random model, saved by transformers two ways."""
    model = hf.make_tiny_llama(seed=14)
    root = tmp_path_factory.mktemp("hf")
    dirs = {"bf16-sharded": root / "bf16-sharded", "fp32-published-config": root / "fp32-published-config"}

    # fp32 first: Module.to() converts in place, and the fp32 file must keep all of fp32's bits.
    model.save_pretrained(dirs["fp32-published-config"])
    assert (dirs["fp32-published-config"] / "model.safetensors").exists()
    hf.rewrite_config_as_published(dirs["fp32-published-config"])

    model.to(torch.bfloat16).save_pretrained(dirs["bf16-sharded"], max_shard_size="100KB")
    shards = sorted(p.name for p in dirs["bf16-sharded"].glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (dirs["bf16-sharded"] / "model.safetensors.index.json").exists(), shards
    return dirs


@pytest.fixture(scope="session")
def eval_window(tmp_path_factory):
    """One window of T = 48: a shard of exactly T + 1 random tokens."""
    seq_len = 48
    tokens = pv.random_tokens(seq_len + 1, seed=5, vocab=hf.VOCAB)
    path = pv.write_shard(tmp_path_factory.mktemp("data") / "window.pvtokens", tokens, hf.VOCAB, hf.EOS)
    return {"path": path, "tokens": tokens, "seq_len": seq_len}


# --- the closing line -------------------------------------------------------------------------

_outcomes = {}  # test id -> "passed" | "failed"


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.when == "call" and report.passed:
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"


def pytest_unconfigure(config):
    # After pytest's own summary: this is the last line the suite prints.
    if config.option.collectonly:
        return
    passed = sum(1 for o in _outcomes.values() if o == "passed")
    failed = sum(1 for o in _outcomes.values() if o == "failed")
    print(f"\n{passed} passed, {failed} failed", flush=True)
