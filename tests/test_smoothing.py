"""SmoothQuant-style smoothing (specdec.models.quantized.smoothing): the same function, flatter inputs, clear errors."""

import pytest
import torch

from specdec.errors import SpecDecError
from specdec.models.quantized.smoothing import activation_maxima, smooth


def tiny(kind: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                  max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
        # an outlier channel, as real models have: the first norm's channel 5 writes 40x larger values
        hf.model.layers[0].input_layernorm.weight[5] = 40.0
    return hf


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 101, (1, 24), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_smoothing_keeps_the_function_and_flattens_the_outliers(kind):
    hf = tiny(kind)
    x = ids(1)
    with torch.no_grad():
        before = hf(input_ids=x).logits
    maxima = activation_maxima(hf, [ids(2), ids(3)])
    assert set(maxima) >= {"model.layers.1.mlp.down_proj", "model.layers.0.self_attn.o_proj"}
    q_in = maxima["model.layers.0.self_attn.q_proj"]
    assert q_in.argmax() == 5 and q_in.max() / q_in.median() > 10
    assert smooth(hf, maxima, alpha=0.5) == 2 * 7
    with torch.no_grad():
        after = hf(input_ids=x).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    flat = activation_maxima(hf, [ids(2), ids(3)])["model.layers.0.self_attn.q_proj"]
    assert flat.max() / flat.median() < (q_in.max() / q_in.median()) / 3


def test_bad_settings_are_refused():
    hf = tiny("qwen2")
    maxima = activation_maxima(hf, [ids(2)])
    with pytest.raises(SpecDecError, match=r"alpha must be in \[0, 1\], got 1.5"):
        smooth(hf, maxima, alpha=1.5)
    with pytest.raises(SpecDecError, match="decoder blocks"):
        smooth(torch.nn.Sequential(torch.nn.Linear(2, 2)), maxima)
    with pytest.raises(SpecDecError, match=r"no calibration maxima for model.layers.0's self_attn.q_proj"):
        smooth(hf, {k: v for k, v in maxima.items() if k != "model.layers.0.self_attn.q_proj"})
    del hf.model.layers[1].mlp.up_proj
    norm = hf.model.layers[0].input_layernorm.weight.clone()
    with pytest.raises(SpecDecError, match="Qwen2 and Llama blocks; model.layers.1 has no mlp.up_proj"):
        smooth(hf, maxima)
    assert torch.equal(hf.model.layers[0].input_layernorm.weight, norm)  # nothing changed before the error
