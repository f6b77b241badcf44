"""The committed NF4 fixtures (test/data/nf4/, read by test/test_nf4.cu) are what the pinned
bitsandbytes gives today: make_nf4_fixtures.py is run again in memory and every tensor and every
metadata entry must equal the committed file's, bit for bit. A new bitsandbytes (or torch) that
quantises differently fails here, naming the tensor, before the C++ tests would silently keep
checking against an old answer.
"""

import os

import pytest
import torch
from safetensors import safe_open

import make_nf4_fixtures as fixtures

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "nf4")


@pytest.fixture(scope="module")
def regenerated():
    return fixtures.make_all()


@pytest.mark.parametrize("name", ["tables", *fixtures.CASES])
def test_committed_fixture_is_what_bitsandbytes_gives(regenerated, name):
    tensors, metadata = regenerated[name]
    with safe_open(os.path.join(DATA, f"{name}.safetensors"), "pt") as committed:
        assert committed.metadata() == metadata
        assert sorted(committed.keys()) == sorted(tensors)
        for key, tensor in tensors.items():
            stored = committed.get_tensor(key)
            assert stored.dtype == tensor.dtype and stored.shape == tensor.shape, key
            as_bytes = tensor.contiguous().reshape(-1).view(torch.uint8)
            assert torch.equal(stored.reshape(-1).view(torch.uint8), as_bytes), key
