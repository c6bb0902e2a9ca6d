"""specdec.models.formats.checkpoint: a weight file read into process memory in chunks gives transformers' model."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import SpecDecError
from specdec.models.formats import checkpoint
from tiny import tiny_model


def file_mappings(path) -> list[tuple[int, int]]:
    """The address ranges at which this process maps ``path`` (Linux: /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def mapped_parameters(model, path) -> list[str]:
    ranges = file_mappings(path)
    return [name for name, p in model.named_parameters()
            if any(start <= p.data_ptr() < end for start, end in ranges)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense")
    tiny_model(eos=None, vocab=64).to(torch.bfloat16).save_pretrained(folder)
    return folder


def test_load_dense_equals_transformers_and_is_not_file_mapped(folder, monkeypatch):
    from transformers import AutoModelForCausalLM

    path = (folder / "model.safetensors").resolve()
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    assert mapped_parameters(reference, path)  # transformers computes from the mapped file: the check sees it

    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 4096)  # many chunks, one mapping each
    model = checkpoint.load_dense(folder, path, torch.bfloat16)
    assert mapped_parameters(model, path) == []  # every weight is a copy in process memory
    ours, theirs = dict(model.state_dict()), dict(reference.state_dict())
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert not model.training


def test_load_dense_converts_to_the_asked_dtype(folder):
    model = checkpoint.load_dense(folder, folder / "model.safetensors", torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_file_that_lacks_weights_is_named(folder, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    missing = next(k for k in sorted(tensors) if "layers.0." in k)
    del tensors[missing]
    save_file(tensors, tmp_path / "partial.safetensors")
    with pytest.raises(SpecDecError, match=f"partial.safetensors lacks weights for: {missing}"):
        checkpoint.load_dense(folder, tmp_path / "partial.safetensors", torch.bfloat16)
