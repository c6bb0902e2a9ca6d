"""The text of a growing generation, at a cost per round that does not grow with its length.

Decoding every generated token again after each round, to print it or to look for stop strings, is
quadratic in the output length. :class:`IncrementalDecoder` decodes only the last two groups of tokens;
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

from typing import Callable, Sequence


class IncrementalDecoder:
    """Turns token groups into the text they add to the decoded sequence.

    decode: token ids -> text (a model's ``decode``). As text-generation-inference does, a push decodes
    the tokens from the start of the previous group and returns what they add to that group's own text:
    a tokenizer may decode a token differently at the start of a sequence (a leading space), so the
    window starts one group early. A group that ends inside a multi-byte character adds '' until a later
    group completes it; a group that adds no text at all (special tokens, skipped by ``decode``) is
    forgotten. The pushes' results joined equal ``decode(all ids)`` for the usual tokenizers
    (byte-level BPE, SentencePiece, word-level); a tokenizer that cleans up spaces across a group
    boundary may differ there.
    """

    def __init__(self, decode: Callable[[list], str]):
        self.decode = decode
        self.ids: list = []
        self.prefix_offset = self.read_offset = 0

    def push(self, ids: Sequence) -> str:
        """The text that ``ids``, appended to the tokens pushed before, add ('' while it is incomplete)."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self.prefix_offset:self.read_offset])
        after = self.decode(self.ids[self.prefix_offset:])
        if after == before:  # tokens without text (special tokens): forget them, or the window would grow
            del self.ids[self.read_offset:]
            return ""
        if after.endswith("\ufffd") or len(after) < len(before):  # an incomplete character: wait for the rest
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before):]


class StopScan:
    """Says when the text of a generation may contain a stop string, reading each round's text once.

    A stop string that was not in the text before a round can only end in the text the round added, so
    a round searches that text and the ``longest stop string - 1`` characters before it: the cost of a
    round is its own tokens, whatever the length of the generation. A True is a candidate: the loop
    confirms it on the whole decoded text (once per generation) before it cuts.
    """

    def __init__(self, decode: Callable[[list], str], stop: Sequence[str]):
        self.stop = tuple(stop)
        self.keep = max(len(s) for s in self.stop) - 1
        self.decoder = IncrementalDecoder(decode)
        self.tail = ""  # the last `keep` characters of the text so far

    def push(self, ids: Sequence) -> bool:
        """True when a stop string ends in the text that ``ids`` (the round's new tokens) add."""
        window = self.tail + self.decoder.push(ids)
        self.tail = window[-self.keep:] if self.keep else ""
        return any(s in window for s in self.stop)
