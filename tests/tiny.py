"""Tiny randomly initialised models and a word-level tokenizer, built offline from configs."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import specdec

WORDS = [f"w{i}" for i in range(92)]
VOCAB = ["<unk>", "<s>", "</s>", "<pad>"] + WORDS  # 96 tokens


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def tiny_model(kind: str = "llama", layers: int = 2, hidden: int = 64, seed: int = 0, vocab: int = len(VOCAB),
               eos: int | None = 2, sharp: float = 1.0, heads: int = 4, kv_heads: int = 2, head_dim: int | None = None):
    """A tiny random causal LM. ``sharp`` scales the output layer (larger = more peaked distributions).
    eos=None gives a model without an end-of-sequence token (it always generates max_new_tokens). ``heads``,
    ``kv_heads`` and ``head_dim`` (default hidden / heads) give the attention the real models' shapes."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=eos, tie_word_embeddings=False,
                  **({"head_dim": head_dim} if head_dim is not None else {}))
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharp)
    model.generation_config.eos_token_id = model.config.eos_token_id
    return model.float().eval()


def load_tiny(kind: str = "llama", **kwargs) -> specdec.LanguageModel:
    return specdec.load(tiny_model(kind, **kwargs), tokenizer=tiny_tokenizer(), name=f"tiny-{kind}")


def captured(model: specdec.LanguageModel) -> specdec.LanguageModel:
    """The same weights behind the static engine with captured steps. configure() refuses CUDA graphs
    without CUDA: on CPU use it under the ``emulated_graphs`` fixture (conftest.py)."""
    out = specdec.load(model.hf_model, tokenizer=model.tokenizer, name=f"{model.name}-captured", engine="static")
    out.cuda_graphs = True
    return out


def perturbed(model: specdec.LanguageModel, scale: float, seed: int = 1) -> specdec.LanguageModel:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that is close but not equal."""
    import copy

    hf = copy.deepcopy(model.hf_model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn(param.shape, generator=g) * scale * param.std())
    return specdec.load(hf, tokenizer=model.tokenizer, name=f"{model.name}-perturbed")


def tiny_gemma3(sliding_window: int = 6, seed: int = 0, eos: int | None = 2):
    """A tiny Gemma 3 with sliding-window layers, to exercise rollback across the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=sliding_window,
        bos_token_id=1, eos_token_id=eos, pad_token_id=3, layer_types=["sliding_attention", "full_attention"] * 2,
    )
    model = Gemma3ForCausalLM(cfg).float().eval()
    model.generation_config.eos_token_id = eos
    return specdec.load(model, tokenizer=tiny_tokenizer(), name="tiny-gemma3")


def tiny_seq2seq(kind: str = "t5", seed: int = 0, vocab: int = len(VOCAB), layers: int = 2, d_model: int = 64,
                 eos: int | None = 2):
    """A tiny random encoder-decoder (T5 or BART) sharing the word-level tokenizer."""
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    if kind == "t5":
        cfg = T5Config(vocab_size=vocab, d_model=d_model, d_kv=16, d_ff=2 * d_model, num_layers=layers,
                       num_decoder_layers=layers, num_heads=4, pad_token_id=3, eos_token_id=eos,
                       decoder_start_token_id=3, tie_word_embeddings=False)
        model = T5ForConditionalGeneration(cfg)
    elif kind == "bart":
        cfg = BartConfig(vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
                         decoder_ffn_dim=2 * d_model, max_position_embeddings=256, pad_token_id=3, bos_token_id=1,
                         eos_token_id=eos, decoder_start_token_id=1, forced_eos_token_id=None)
        model = BartForConditionalGeneration(cfg)
    else:
        raise ValueError(kind)
    model.generation_config.eos_token_id = eos
    model.generation_config.forced_eos_token_id = None
    model.generation_config.forced_bos_token_id = None
    return specdec.load(model.float().eval(), tokenizer=tiny_tokenizer(), name=f"tiny-{kind}")


# A character vocabulary (every printable ASCII character a token, plus a few JSON pieces): any text is expressible,
# so JSON schemas and regular expressions constrain tiny models (tests/test_constraints.py).
CHAR_PIECES = ['{"', '":', '",', ' "', '"}', "true", "false", "null"]
CHAR_VOCAB = ["<unk>", "<s>", "</s>", "<pad>"] + [chr(c) for c in range(32, 127)] + CHAR_PIECES  # 107 tokens


def char_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Regex, decoders

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(CHAR_VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one character per token
    tok.decoder = decoders.Fuse()  # tokens joined without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def load_tiny_chars(kind: str = "llama", **kwargs) -> specdec.LanguageModel:
    """A tiny random causal LM over :func:`char_tokenizer` (see :func:`tiny_model` for the options)."""
    return specdec.load(tiny_model(kind, vocab=len(CHAR_VOCAB), **kwargs), tokenizer=char_tokenizer(),
                        name=f"tiny-chars-{kind}")
