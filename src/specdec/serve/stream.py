"""Streamed text that never shows a stop string, nor anything after one.

The decoding loop reports tokens one accepted group at a time (:data:`specdec.decoding.TokenCallback`);
the text of a group may end with the beginning of a stop string ("<|end" of "<|endoftext|>"), which the
next group may complete. :class:`TextStream` sends only the text that can no longer become part of a
stop string, and holds the rest back until a later group decides it.

    >>> s = TextStream(lambda ids: "".join(ids), stop=["END"])
    >>> s.push(["a", "b", "E"]), s.push(["N"]), s.push(["x"]), s.finish("abENx")
    ('ab', '', 'ENx', '')
    >>> s = TextStream(lambda ids: "".join(ids), stop=["END"])
    >>> s.push(["a", "E", "N"]), s.push(["D", "z"]), s.finish("a")
    ('a', '', '')
"""

from __future__ import annotations

from typing import Callable, Sequence

from specdec.text import IncrementalDecoder


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop string."""
    longest = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


class TextStream:
    """Turns accepted token groups into text deltas; the deltas joined equal the generation's text.

    decode: token ids -> text (the target's ``decode``). stop: the request's stop strings.
    """

    def __init__(self, decode: Callable[[list], str], stop: Sequence[str] = ()):
        self.decoder = IncrementalDecoder(decode)  # one short decode per group (specdec.text)
        self.stop = tuple(stop)
        self.text = ""  # the decoded text so far
        self.sent = ""  # the part of it already sent

    def push(self, ids: Sequence) -> str:
        """The new text that is safe to send after the tokens ``ids`` ('' while it is held back)."""
        added = self.decoder.push(ids)
        if not added:  # an incomplete multi-byte character, or tokens without text: wait
            return ""
        self.text += added
        start = max(0, len(self.sent) - max((len(s) for s in self.stop), default=0))
        cuts = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        visible = self.text[: min(cuts)] if cuts else self.text[: len(self.text) - held_back(self.text, self.stop)]
        return self._advance(visible)

    def finish(self, text: str) -> str:
        """The rest of the generation's final ``text`` (the library's, stop strings already cut)."""
        return self._advance(text)

    def _advance(self, visible: str) -> str:
        # Decoding more tokens can rewrite earlier text (rare: spacing clean-up); wait until it agrees again.
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta, self.sent = visible[len(self.sent):], visible
        return delta
