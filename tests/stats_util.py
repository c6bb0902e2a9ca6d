"""Statistical checks shared by the distribution tests."""

from __future__ import annotations

import numpy as np
from scipy import stats


def chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit of observed ``counts`` to ``probs``.

    Cells with an expected count below ``min_expected`` are pooled into one, the usual condition for
    the chi-square approximation. A cell with probability 0 that was observed gives p-value 0.
    """
    counts = np.asarray(counts, dtype=float)
    probs = np.asarray(probs, dtype=float)
    probs = probs / probs.sum()
    n = counts.sum()
    if np.any((probs == 0) & (counts > 0)):
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def total_variation(counts, probs) -> float:
    counts = np.asarray(counts, dtype=float)
    probs = np.asarray(probs, dtype=float)
    return 0.5 * float(np.abs(counts / counts.sum() - probs / probs.sum()).sum())
