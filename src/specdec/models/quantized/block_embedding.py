"""An input embedding kept in its stored block form, its rows made float32 as they are looked up.

A quantized preset stores its embedding table exactly as the GGUF holds it where that gives the float32 table back
bit for bit (checked at conversion, :mod:`specdec.models.formats.gguf_convert`): int8 values with a float16 scale per 32
(Q8_0 / Q5_0 / Q4_0 tables: the 0.5B's) or the Q4_K form (the 1.5B's). Expanding such a table at load made a
float32 copy of 151,936 rows (545 MB for the 0.5B, 933 MB for the 1.5B) of which a step reads a handful. These
modules keep the stored form and expand only the rows looked up, with the same operations on the same numbers as the
whole expansion, so every row is the float32 table's bit for bit (tests/test_block_embedding.py).
"""

from __future__ import annotations

import torch

from specdec.models.quantized.int4 import SUB, SUPER, Int4Weight

#: Values per block (one float16 scale d each) of the GGUF types stored as int8 k and float16 d (Q8_0, Q5_0, Q4_0).
BLOCK = 32


class BlockEmbedding(torch.nn.Module):
    """An embedding stored as int8 ``k`` [V, H] and float16 ``d`` [V, H / 32]: row v is ``float(k[v]) * float(d[v])``
    per block of 32, as :func:`specdec.models.formats.stored.expand_blocks` makes the whole table."""

    def __init__(self, k: torch.Tensor, d: torch.Tensor):
        super().__init__()
        if k.dim() != 2 or k.dtype != torch.int8 or d.shape != (k.shape[0], k.shape[1] // BLOCK):
            raise ValueError("BlockEmbedding: int8 k [V, H] and float16 d [V, H / 32]")
        self.register_buffer("k", k)
        self.register_buffer("d", d)
        self.num_embeddings, self.embedding_dim = k.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [...] -> [..., H] float32
        rows = self.k[ids].to(torch.float32).view(*ids.shape, -1, BLOCK)  # [..., H / 32, 32]
        return rows.mul_(self.d[ids].to(torch.float32).unsqueeze(-1)).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 blocks of {BLOCK}"


class Int4Embedding(torch.nn.Module):
    """An embedding stored in the Q4_K form as an :class:`~specdec.models.quantized.int4.Int4Weight` [V, H]: row v is
    ``d * sc * q - dmin * m`` computed as :meth:`Int4Weight.dequantized` computes the whole table."""

    def __init__(self, weight: Int4Weight):
        super().__init__()
        self.register_buffer("packed", weight.packed)
        self.register_buffer("dmins", weight.dmins)
        self.register_buffer("scs", weight.scs)
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [...] -> [..., H] float32
        flat = ids.reshape(-1)
        n, groups = flat.numel(), self.packed.shape[0]
        group, column = flat // 32, flat % 32  # [n]: each row's packed group and its column there
        lanes = self.packed.view(groups, -1, 16, 4)[group, :, column % 16]  # [n, H_p / 4, 4]: its bytes, two rows each
        shift = (column // 16 * 4).to(torch.uint8).view(n, 1, 1)  # the high nibble holds columns 16-31
        q = ((lanes >> shift) & 15).to(torch.float32).view(n, -1, SUB)  # [n, H_p / 32, 32]
        dmin = self.dmins.view(groups, -1, 2, 32)[group, :, :, column].to(torch.float32)  # [n, H_p / 256, 2]: d, dmin
        scm = self.scs.view(groups, -1, 2, 32)[group, :, :, column].to(torch.float32)  # [n, H_p / 32, 2]: sc, m
        per = SUPER // SUB
        scale = (dmin[:, :, None, 0] * scm[:, :, 0].view(n, -1, per)).view(n, -1, 1)  # d * sc per sub-block
        offset = (dmin[:, :, None, 1] * scm[:, :, 1].view(n, -1, per)).view(n, -1, 1)  # dmin * m
        rows = (q * scale - offset).view(n, -1)  # [n, H_p]: dequantized()'s operations, elementwise
        return rows[:, : self.embedding_dim].reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int4 (Q4_K form)"


def stored_embedding(hf, key: str, form: tuple | Int4Weight) -> bool:
    """Put ``form`` (``(k, d)`` int8 blocks or an Int4Weight) in place of ``hf``'s input embedding if ``key`` is
    that embedding's weight, the embedding a plain ``nn.Embedding`` (not a scaled one) and not tied to the output
    layer; False otherwise (the caller expands the table)."""
    module = hf.get_input_embeddings()
    owner = key.rpartition(".")[0]
    if (type(module) is not torch.nn.Embedding or getattr(hf.config, "tie_word_embeddings", False)
            or hf.get_submodule(owner) is not module or not key.endswith(".weight")):
        return False
    hf.set_input_embeddings(Int4Embedding(form) if isinstance(form, Int4Weight) else BlockEmbedding(*form))
    return True
