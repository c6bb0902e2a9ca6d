"""A suffix draft (SuffixDecoding, Oliaro et al. 2024, one path): continue the longest repeated suffix the way
its earlier occurrences most often continued, for as long as they agree.

Prompt lookup (:mod:`specdec.drafters.prompt_lookup`) copies after the most recent match of the last 1-3 tokens,
always k tokens. The suffix draft answers what a suffix tree over the prompt and the text so far answers:

1. the match: the longest suffix of the sequence (up to ``max_depth`` tokens) that occurred before;
2. the path: from all those occurrences, the next token most of them continue with (ties: the most recent),
   then, among the occurrences that agree, the next one, and so on;
3. the length: the path stops when its empirical probability (the product of the agreeing shares) falls below
   ``min_probability``, and it is never longer than ``spec_factor`` times the match (a one-token match
   proposes at most ``spec_factor`` tokens: SuffixDecoding's adaptive speculation length).

So a long, consistent repetition is drafted far and a weak one briefly or not at all: on a CPU, where each
verified token costs (the int8 target's pass over 8 tokens costs 1.4-1.8x its one-token step), a draft that
proposes what it is sure of saves target time. Like prompt lookup it gives no probabilities (one-hot q), so
it is exact under greedy and sampled verification. The scan is vectorized over the sequence (numpy): for the
few thousand tokens of a generation it costs tens of microseconds a round, less than building a tree.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specdec.drafters.base import Draft, DrafterBase
from specdec.errors import SpecDecError


def suffix_continuation(context: Sequence[int], k: int, max_depth: int = 32, min_probability: float = 0.1,
                        spec_factor: float = 2.0) -> list[int]:
    """Up to k tokens continuing ``context`` along its longest repeated suffix (see the module docstring).

    >>> suffix_continuation([1, 2, 3, 4, 9, 1, 2, 3], k=3)      # the 3-token match [1, 2, 3] continued
    [4, 9, 1]
    >>> suffix_continuation([7, 5, 1, 8, 5, 1, 8, 2, 5, 1], k=4)  # both [5, 1] went on with 8; then 5 or 2: the later
    [8, 2, 5, 1]
    >>> suffix_continuation([7, 5, 1, 8, 5, 1, 8, 2, 5, 1], k=4, min_probability=0.6)  # stop where they disagree
    [8]
    >>> suffix_continuation([1, 2, 3], k=2)                      # nothing repeats
    []
    """
    seq = np.asarray(context, dtype=np.int64)  # [L]
    length = seq.shape[0]
    if k <= 0 or length < 2:
        return []
    ends = np.flatnonzero(seq[:-1] == seq[-1])  # [m]: earlier positions where the last token occurred
    if ends.size == 0:
        return []
    depth = 1  # the match: extend backwards while some occurrence still agrees
    while depth < max_depth:
        starts = ends - depth
        ok = starts >= 0
        agree = ends[ok][seq[starts[ok]] == seq[length - 1 - depth]]
        if agree.size == 0:
            break
        ends, depth = agree, depth + 1
    limit = min(k, int(spec_factor * depth))
    tokens: list[int] = []
    probability = 1.0
    cursor = ends + 1  # [m]: where each occurrence's continuation is
    while len(tokens) < limit:
        cursor = cursor[cursor < length]
        if cursor.size == 0:
            break
        following = seq[cursor]  # [m]
        values, inverse, counts = np.unique(following, return_inverse=True, return_counts=True)
        latest = np.zeros(values.shape[0], dtype=np.int64)
        np.maximum.at(latest, inverse, cursor)
        best = np.lexsort((latest, counts))[-1]  # the most frequent; among those, the most recent
        probability *= counts[best] / cursor.size
        if probability < min_probability:
            break
        tokens.append(int(values[best]))
        cursor = cursor[following == values[best]] + 1
    return tokens


class SuffixDrafter(DrafterBase):
    """Proposes :func:`suffix_continuation` of the sequence (and, for a seq2seq target, its encoder input
    before it). Without probabilities: each proposed token counts as a one-hot q."""

    name = "suffix"

    def __init__(self, max_depth: int = 32, min_probability: float = 0.1, spec_factor: float = 2.0):
        if max_depth < 1 or not 0.0 <= min_probability <= 1.0 or spec_factor <= 0:
            raise SpecDecError(f"the suffix draft needs max_depth >= 1, 0 <= min_probability <= 1 and spec_factor > 0; "
                               f"got {max_depth}, {min_probability}, {spec_factor}")
        self.max_depth, self.min_probability, self.spec_factor = max_depth, min_probability, spec_factor

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        context = [*self.context.source_ids, *sequence] if self.context.source_ids else sequence
        tokens = suffix_continuation(context, k, self.max_depth, self.min_probability, self.spec_factor)
        return Draft.from_ids(tokens, self.context.device)
