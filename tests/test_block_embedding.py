"""The input embedding kept in its stored form (specdec.models.quantized.block_embedding): every row it looks up is the whole
expanded table's row bit for bit, and a stored model keeps its embedding so and gives the same logits."""

import pytest
import torch

from specdec.models.kernels import extension
from specdec.models.quantized.block_embedding import BlockEmbedding, Int4Embedding
from specdec.models.quantized.int4 import Int4Weight
from specdec.models.formats.stored import expand_blocks

needs_vnni = pytest.mark.skipif(not extension.cpu_supported(), reason="the int4 layout is built by specdec's extension")


def test_int8_block_rows_are_the_expanded_tables_rows():
    torch.manual_seed(0)
    k = torch.randint(-128, 128, (100, 96), dtype=torch.int8)
    d = (torch.rand(100, 3) * 0.1).to(torch.float16)
    table, module = expand_blocks(k, d), BlockEmbedding(k, d)
    for ids in (torch.tensor([[5]]), torch.tensor([[0, 99, 5, 5, 42]]), torch.randint(0, 100, (3, 7))):
        out = module(ids)
        assert out.shape == (*ids.shape, 96) and out.dtype == torch.float32
        assert torch.equal(out, table[ids])
    with pytest.raises(ValueError, match="int8 k"):
        BlockEmbedding(k.float(), d)


@needs_vnni
@pytest.mark.parametrize("rows, cols", [(100, 256), (64, 512), (33, 768)])
def test_q4k_rows_are_the_dequantized_tables_rows(rows, cols):
    """Rows in every position of their packed group (both nibbles, the padded last group) and any id shape."""
    torch.manual_seed(1)
    weight = Int4Weight.quantize(torch.randn(rows, cols))
    table, module = weight.dequantized(), Int4Embedding(weight)
    everything = torch.arange(rows)[None]
    assert torch.equal(module(everything), table[everything])
    for ids in (torch.tensor([[rows - 1]]), torch.randint(0, rows, (2, 9))):
        assert torch.equal(module(ids), table[ids])
    planted = Int4Weight(weight.packed.clone(), weight.dmins, weight.scs, rows, cols)
    planted.packed[0, 0, 4] ^= 1  # column 1's first value: its row must differ, no other
    diff = (Int4Embedding(planted)(everything) != table[everything]).any(-1)[0]
    assert diff.nonzero().flatten().tolist() == [1]


@needs_vnni
@pytest.mark.parametrize("form, tied", [("int8 blocks", False), ("Q4_K", False), ("int8 blocks", True)])
def test_a_stored_model_keeps_its_embedding_in_the_stored_form(tmp_path, form, tied):
    """save_quantized with the table's stored form -> load_quantized puts the module in place of the embedding (not
    when the embeddings are tied: then the table is expanded as before), with the float model's logits."""
    from specdec.models.quantized.int4 import int4_weights
    from specdec.models.formats.stored import load_quantized, save_quantized
    from tiny import tiny_model

    hf = tiny_model(eos=None, hidden=256).float().eval()
    if tied:
        hf.config.tie_word_embeddings = True
        hf.tie_weights()
    key = "model.embed_tokens.weight"
    table = hf.model.embed_tokens.weight.detach()
    if form == "Q4_K":
        stored = Int4Weight.quantize(table)
        expected = stored.dequantized()
    else:
        d = (table.abs().view(table.shape[0], -1, 32).amax(-1) / 127).to(torch.float16)
        k = (table.view(table.shape[0], -1, 32) / d.float().unsqueeze(-1)).round().clamp(-128, 127).to(torch.int8)
        stored = (k.view(table.shape), d)
        expected = expand_blocks(*stored)
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(expected)  # the float model the stored form gives back exactly
    hf.save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    reference = load_reference(hf, tmp_path, ids)
    path = tmp_path / "model.int4.safetensors"
    save_quantized(hf, path, "int4", blocks={key: stored}, weights=int4_weights(hf, free_floats=True))
    loaded = load_quantized(tmp_path, path, "int4")
    kind = torch.nn.Embedding if tied else Int4Embedding if form == "Q4_K" else BlockEmbedding
    assert type(loaded.model.embed_tokens) is kind and not any(p.is_meta for p in loaded.parameters())
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, reference)


def load_reference(hf, folder, ids):
    """The logits of ``hf`` quantized as a conversion does (its own float embedding)."""
    import copy

    from specdec.models.quantized.quantize import quantize_hf

    model = copy.deepcopy(hf)
    quantize_hf(model, "int4")
    with torch.inference_mode():
        return model(ids).logits


@needs_vnni
def test_a_conversion_keeps_a_q4k_table_only_where_it_gives_the_float_table_back():
    """gguf_convert's check, chunk by chunk: the table's own dequantization passes; one value off in the last
    chunk's last row fails it."""
    from specdec.models.formats.gguf_convert import _gives_back

    torch.manual_seed(2)
    weight = Int4Weight.quantize(torch.randn(100, 256))
    table = weight.dequantized()
    assert _gives_back(weight, table, rows=32) and _gives_back(weight, table)
    table[99, 255] = torch.nextafter(table[99, 255], torch.tensor(1e9))
    assert not _gives_back(weight, table, rows=32)
