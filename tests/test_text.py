"""Incremental decoding and stop-string scanning (specdec.text) against decoding everything again."""

import random

import pytest

from specdec.models.random_weights import byte_tokenizer
from specdec.text import IncrementalDecoder, StopScan
from tiny import tiny_tokenizer

TEXT = "héllo wörld, ünïcode 漢字 and emoji 🙂 END of text 🙂🙂"


def _groups(ids, seed):
    rng, i, out = random.Random(seed), 0, []
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i: i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_byte_level_pieces_join_to_the_whole_text(seed):
    tok = byte_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert len(ids) > len(TEXT)  # multi-byte characters span several tokens
    decoder = IncrementalDecoder(lambda x: tok.decode(x, skip_special_tokens=True))
    pieces = [decoder.push(g) for g in _groups(ids, seed)]
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)  # half a character is never shown


def test_word_level_pieces_keep_the_spaces_and_forget_special_tokens():
    tok = tiny_tokenizer()
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    ids = tok("w1 w2 w3 w4 w5 w6")["input_ids"]
    decoder = IncrementalDecoder(decode)
    pieces = [decoder.push([ids[0]]), decoder.push([0, 3]), decoder.push(ids[1:3]), decoder.push([3] * 50)]
    pieces += [decoder.push([t]) for t in ids[3:]]
    assert "".join(pieces) == decode(ids) == "w1 w2 w3 w4 w5 w6"
    assert pieces[:4] == ["w1", "", " w2 w3", ""]
    assert len(decoder.ids) <= len(ids)  # the 52 special tokens were forgotten


@pytest.mark.parametrize("seed", range(5))
def test_stop_scan_fires_on_the_group_that_completes_a_stop_string(seed):
    tok = byte_tokenizer()
    decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
    ids = tok(TEXT)["input_ids"]
    stops = ["no such", "🙂 EN", "D of"]  # each spans tokens; "🙂 EN" spans a 4-byte character
    scan = StopScan(decode, stops)
    seen = []
    for group in _groups(ids, seed):
        seen.extend(group)
        found = scan.push(group)
        assert found == any(s in decode(seen) for s in stops), decode(seen)
        if found:
            break
    assert found and "🙂 EN" in decode(seen) and "🙂 EN" not in decode(seen[: len(seen) - len(group)])


def test_stop_scan_reads_only_a_window():
    tok = tiny_tokenizer()
    calls = []

    def decode(x):
        calls.append(len(x))
        return tok.decode(x, skip_special_tokens=True)

    scan = StopScan(decode, ["w9 w9 w9"])
    for _ in range(300):
        assert not scan.push([10, 11])
    # One decode a push, and one each time the window restarts: after a restart it holds one group, and
    # it restarts when more than `window` (8) tokens precede a group: every 5 pushes of 2 tokens.
    assert scan.decoder.window == 8 and len(calls) == 300 + 300 // 5 - 1
    assert max(calls) == scan.decoder.window + 2 + 2 and len(scan.tail) == len("w9 w9 w9") - 1
    assert scan.push([13]) is False and scan.push([13, 13, 13]) is True  # w9 is token 13


def test_model_decode_equals_the_tokenizers_decode():
    """LanguageModel.decode calls the Rust tokenizer directly where that is what transformers does."""
    from tiny import load_tiny

    from specdec.text import backend_decoder

    model = load_tiny()
    assert backend_decoder(model.tokenizer) is model.tokenizer.backend_tokenizer
    ids = model.tokenizer("w1 w2 </s> w3 <pad> w4")["input_ids"] + [0, 1, 2, 3]
    assert model.decode(ids) == model.tokenizer.decode(ids, skip_special_tokens=True) == "w1 w2 w3 w4"
    # With transformers' space clean-up on, the fast path steps aside (a stand-in clean-up shows it ran).
    model.tokenizer.clean_up_tokenization_spaces = True
    model.tokenizer.clean_up_tokenization = str.upper
    try:
        assert model.decode(ids) == "W1 W2 W3 W4"
    finally:
        model.tokenizer.clean_up_tokenization_spaces = False
        del model.tokenizer.clean_up_tokenization
    tok = byte_tokenizer()
    ids = tok(TEXT)["input_ids"]
    model.tokenizer, saved = tok, model.tokenizer
    try:
        del model._decode  # (cached per model)
        assert model.decode(ids) == tok.decode(ids, skip_special_tokens=True) == TEXT
        assert model.decode(ids[:1] + ids[6:8]) == tok.decode(ids[:1] + ids[6:8], skip_special_tokens=True)
    finally:
        model.tokenizer = saved


def _byte_level_model():
    """A LanguageModel with the byte-level tokenizer (its decoder is tokenizers' ByteLevel)."""
    import specdec
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = byte_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=None, bos_token_id=None)
    return specdec.load(LlamaForCausalLM(config), tokenizer=tok, name="bytes")


def test_piece_bytes_only_where_a_text_is_its_tokens_bytes_joined():
    """For a byte-level tokenizer the text of any tokens, random bytes included (invalid UTF-8, split
    characters), is their bytes joined and decoded as Python decodes with errors="replace"; and decoding
    in two parts cut by complete_prefix gives the same text."""
    from tiny import load_tiny

    from specdec.text import complete_prefix

    model = _byte_level_model()
    piece = model.piece_bytes
    assert piece is not None
    rng = random.Random(0)
    alphabet = list(TEXT) + ["\n", " ", "\t", "€", "𝄞", "\ufffd"]
    for n in range(400):
        if n % 2:
            ids = model.tokenizer("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))))["input_ids"]
        else:  # any token ids at all: random bytes and special tokens
            ids = [rng.randrange(len(model.tokenizer)) for _ in range(rng.randint(1, 12))]
        data = b"".join(piece(i) for i in ids)
        assert data.decode("utf-8", errors="replace") == model.decode(ids)
        for split in range(len(ids) + 1):
            head = b"".join(piece(i) for i in ids[:split])
            cut = complete_prefix(head)
            assert head[:cut].decode("utf-8", "replace") + (head[cut:] + data[len(head):]).decode("utf-8", "replace") \
                == model.decode(ids)
    assert load_tiny().piece_bytes is None  # a word-level decoder adds spaces between tokens
    model.tokenizer.clean_up_tokenization_spaces = True
    assert type(model).piece_bytes.func(model) is None  # transformers' clean-up changes text across tokens


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("stops, first", [(["no such", "🙂 EN", "D of"], "🙂 EN"), (["no such", "ö"], "ö"),
                                          (["字 a"], "字 a")])  # each spans tokens (multi-byte characters)
def test_stop_scan_reads_pieces_without_decoding_and_finds_what_decoding_finds(seed, stops, first):
    model = _byte_level_model()
    calls = []

    def decode(ids):
        calls.append(list(ids))
        return model.decode(ids)

    ids = model.tokenizer(TEXT)["input_ids"]
    scan, reference = StopScan(decode, stops, model.piece_bytes), StopScan(model.decode, stops)
    seen = []
    for group in _groups(ids, seed):
        seen.extend(group)
        found = scan.push(group)
        assert found == reference.push(group) == any(s in model.decode(seen) for s in stops), model.decode(seen)
        if found:
            break
    assert found and first in model.decode(seen) and first not in model.decode(seen[: len(seen) - len(group)])
    assert calls == []  # the piece path never decodes
