"""The text of a growing generation, at a cost per round that does not grow with its length.

Decoding every generated token again after each round, to print it or to look for stop strings, is
quadratic in the output length. :class:`IncrementalDecoder` decodes only a short window of recent tokens;
:class:`StopScan` looks for stop strings only in the text a round added, plus the characters before it
that a stop string ending in that text can reach back to.

    >>> d = IncrementalDecoder(lambda ids: "".join(ids))
    >>> d.push(["a", "b"]), d.push(["c"])
    ('ab', 'c')
    >>> s = StopScan(lambda ids: "".join(ids), ["END"])
    >>> s.push(["x", "E"]), s.push(["N"]), s.push(["D", "y"])
    (False, False, True)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


class IncrementalDecoder:
    """Turns token groups into the text they add to the decoded sequence, one short decode per group.

    decode: token ids -> text (a model's ``decode``). The decoder keeps a window of recent tokens and
    the text it has returned for them; a push decodes the window with the new tokens and returns what
    the text gained. When more than ``window`` tokens precede a group, the window then restarts at that
    group, which stays as the context of the next (as text-generation-inference does: a tokenizer may
    decode a token differently at the start of a sequence, a leading space). A group that ends inside a multi-byte
    character adds '' until a later group completes it; a group that adds no text at all (special
    tokens, skipped by ``decode``) is forgotten. The pushes' results joined equal ``decode(all ids)``
    for the usual tokenizers (byte-level BPE, SentencePiece, word-level); a tokenizer that cleans up
    spaces across a window boundary may differ there.
    """

    def __init__(self, decode: Callable[[list], str], window: int = 8):
        self.decode, self.window = decode, window
        self.ids: list = []  # the window: tokens from its start to the end
        self.text = ""  # the window's text, as far as it was returned
        self.read = 0  # tokens of the window whose text was returned; later ones wait for a character's end

    def push(self, ids: Sequence) -> str:
        """The text that ``ids``, appended to the tokens pushed before, add ('' while it is incomplete)."""
        self.ids.extend(ids)
        text = self.decode(self.ids)
        if text == self.text:  # tokens without text (special tokens): forget them, or the window would grow
            del self.ids[self.read:]
            return ""
        if text.endswith("\ufffd") or len(text) < len(self.text):  # an incomplete character: wait for the rest
            return ""
        added = text[len(self.text):]
        if self.read > self.window:  # more than `window` tokens before this group: restart the window at it
            del self.ids[:self.read]
            self.text = self.decode(self.ids)
        else:
            self.text = text
        self.read = len(self.ids)
        return added


def complete_prefix(data: bytes) -> int:
    """Where the unfinished UTF-8 character at the end of ``data`` starts (``len(data)`` if there is none):
    its lead byte and fewer continuation bytes than the lead byte announces. Decoding ``data[:cut]`` and
    later ``data[cut:] + more`` (errors="replace") gives the text of decoding ``data + more`` at once: no
    character that starts before the cut reaches past it."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last byte that is not a continuation byte
            need = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 1
            return len(data) - back if back < need else len(data)
    return len(data)


class StopScan:
    """Says when the text of a generation may contain a stop string, reading each round's text once.

    A stop string that was not in the text before a round can only end in the text the round added, so
    a round searches that text and the ``longest stop string - 1`` characters before it: the cost of a
    round is its own tokens, whatever the length of the generation. A True is a candidate: the loop
    confirms it on the whole decoded text (once per generation) before it cuts.
    """

    def __init__(self, decode: Callable[[list], str], stop: Sequence[str], piece: Callable[[int], bytes] | None = None):
        """decode: token ids -> text. piece: token id -> its UTF-8 bytes, for a tokenizer whose text of any
        tokens is their bytes joined and decoded (a byte-level tokenizer: ``LanguageModel.piece_bytes``);
        a round is then read without a decode call, holding back only the bytes of a character that a
        later token completes. None: each round decodes a short window (IncrementalDecoder)."""
        self.stop = tuple(stop)
        self.keep = max(len(s) for s in self.stop) - 1
        self.piece = piece
        self.decoder = IncrementalDecoder(decode)
        self.pending = b""  # piece path: the start of a character the next tokens may complete (<= 3 bytes)
        self.tail = ""  # the last `keep` characters of the text so far

    def _added(self, ids: Sequence) -> str:
        """The text that ``ids`` add; the bytes of an unfinished character wait for the next push."""
        if self.piece is None:
            return self.decoder.push(ids)
        data = self.pending + b"".join([self.piece(i) for i in ids])
        cut = complete_prefix(data)
        self.pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def push(self, ids: Sequence) -> bool:
        """True when a stop string ends in the text that ``ids`` (the round's new tokens) add."""
        window = self.tail + self._added(ids)
        self.tail = window[-self.keep:] if self.keep else ""
        for s in self.stop:
            if s in window:
                return True
        return False


# -- tokenizer internals: fast paths that give exactly what transformers' decode gives ------------------

def backend_decoder(tokenizer: Any) -> Any:
    """The Rust tokenizer, where its ``decode`` is exactly what transformers' ``decode`` runs (a
    tokenizers-backed class that overrides neither ``decode`` nor ``_decode``; without space clean-up,
    checked per call): it skips transformers' per-call conversions, 4 of the 5 microseconds a short
    decode takes, which the decoding loop pays every round with stop strings. None otherwise."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - another transformers layout
        return None
    kind = type(tokenizer)
    if (isinstance(tokenizer, TokenizersBackend) and kind._decode is TokenizersBackend._decode
            and kind.decode is PreTrainedTokenizerBase.decode):
        return tokenizer.backend_tokenizer
    return None


def fast_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """ids -> ``tokenizer.decode(ids, skip_special_tokens=True)``, through :func:`backend_decoder` when that
    gives the same text (no space clean-up at the time of the call)."""
    backend = backend_decoder(tokenizer)

    def decode(ids: list[int]) -> str:
        if backend is not None and not tokenizer.clean_up_tokenization_spaces:
            return backend.decode(ids, skip_special_tokens=True)
        return tokenizer.decode(ids, skip_special_tokens=True)

    return decode


def piece_bytes(tokenizer: Any) -> Callable[[int], bytes] | None:
    """token id -> the UTF-8 bytes of that token (memoized; b"" for a special token), where the text of
    any tokens is their bytes joined and decoded: a byte-level tokenizer (GPT-2, Qwen, Llama 3,
    SmolLM2), whose decoder does exactly that, run by the Rust tokenizer without space clean-up.
    None otherwise (SentencePiece and WordPiece decoders change a token's text with its neighbours).
    The stop scan reads a round's text with it, without a decode call (:class:`StopScan`)."""
    backend = backend_decoder(tokenizer)
    if backend is None or tokenizer.clean_up_tokenization_spaces:
        return None
    try:
        from tokenizers import decoders
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:  # pragma: no cover - another transformers layout
        return None
    if type(backend.decoder) is not decoders.ByteLevel:
        return None
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    memo: dict[int, bytes] = {}

    def piece(token: int) -> bytes:
        data = memo.get(token)
        if data is None:
            text = backend.decode([token], skip_special_tokens=True)
            if "\ufffd" in text:  # part of a character (or U+FFFD itself): the token's own bytes
                name = backend.id_to_token(token)
                text_bytes = [byte_of.get(c) for c in name]
                data = bytes(text_bytes) if None not in text_bytes else name.encode("utf-8")
            else:
                data = text.encode("utf-8")
            memo[token] = data
        return data

    return piece
