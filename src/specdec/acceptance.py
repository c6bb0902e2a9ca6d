"""Speculative sampling: the acceptance step of Algorithm 1 (paper Section 2.3, lines 10-18).

Notation follows the paper everywhere in specdec: p is the target model's (standardized)
distribution, q is the draft's, gamma is the number of drafted tokens.

Vocabulary of one verification step:

- drafted tokens: x_1..x_gamma, proposed by the draft (sampled from q_1..q_gamma, or copied when
  the draft has no probabilities, which counts as a one-hot q);
- accepted tokens: the longest prefix x_1..x_n that survives the test r_i < p_i(x_i) / q_i(x_i);
- rejected token: x_{n+1}, the first one that fails (only when n < gamma);
- residual (recovered) token: sampled from norm(max(0, p_{n+1} - q_{n+1})) in place of the rejected one;
- bonus token: sampled from p_{gamma+1} when all gamma drafted tokens are accepted.

Every step therefore emits n accepted tokens followed by exactly one target token (residual or
bonus), between 1 and gamma + 1 tokens in all.

Lenience l in (0, 1] (paper Appendix A.5) multiplies q by l before it is compared with p: token x is
accepted with probability min(1, p(x) / (l q(x))) and the residual is norm(max(0, p - l q)). No token
is then emitted with probability above p(x) / l; l = 1 is the exact algorithm. At temperature 0,
lenience accepts x when p(x) >= l * max(p) on the unstandardized distribution.
"""

from __future__ import annotations

import torch

from specdec.sampling import sample

# Below this mass the residual max(0, p - q) is numerically zero: p and q agree on that row, so a
# rejection had probability ~0 and p itself is the correct distribution to sample from.
RESIDUAL_EPS = 1e-9


def residual_distribution(
    p: torch.Tensor, q: torch.Tensor | None, rejected: torch.Tensor, lenience: float = 1.0
) -> torch.Tensor:
    """norm(max(0, p - l q)), the distribution that replaces a rejected draft token.

    p: [V] target probabilities; q: [V] draft probabilities, or None for a one-hot draft of the
    rejected token ``rejected`` (a 0-dim token id); lenience l (1 = exact). Returns [V]
    probabilities. When the residual has (numerically) no mass, returns p instead of dividing by zero.
    """
    if q is None:
        residual = p.clone()
        residual[rejected] = (residual[rejected] - lenience).clamp_min(0.0)
    else:
        residual = (p - lenience * q).clamp_min(0.0)
    mass = residual.sum()
    if mass <= RESIDUAL_EPS:
        return p
    return residual / mass


def speculative_sampling(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    lenience: float = 1.0,
) -> tuple[torch.Tensor, int]:
    """Accept a prefix of the drafted tokens and append one token from the target.

    p: [gamma + 1, V] target probabilities; row i is p(. | prefix, x_1..x_i).
    q: [gamma, V] draft probabilities for the drafted positions, or None for a one-hot draft.
    draft_tokens: [gamma] long, the drafted tokens x_1..x_gamma.
    generator: source of the uniform draws r_i and of the final sample.
    lenience: l in (0, 1]; 1 (the default) is exact, see the module docstring.

    Returns (tokens, n): tokens [n + 1] long = x_1..x_n followed by one residual or bonus token, and
    n, the number of drafted tokens accepted (0 <= n <= gamma).

    The output token at each position is distributed exactly as p (paper Appendix A.1).
    """
    gamma = draft_tokens.shape[0]
    if p.shape[0] != gamma + 1:
        raise ValueError(f"p must have gamma + 1 = {gamma + 1} rows, got {p.shape[0]}")
    if q is not None and q.shape[0] != gamma:
        raise ValueError(f"q must have gamma = {gamma} rows, got {q.shape[0]}")
    positions = torch.arange(gamma)
    p_x = p[positions, draft_tokens]  # [gamma]
    q_x = q[positions, draft_tokens] if q is not None else torch.ones_like(p_x)  # [gamma]
    r = torch.rand(gamma, generator=generator, dtype=p_x.dtype)  # [gamma], U[0, 1)
    # Accept x_i with probability min(1, p/q): r < p/q, written without a division. A token the
    # target gives probability 0 is never accepted.
    accepted = r * (lenience * q_x) < p_x  # [gamma] bool
    n = int(accepted.long().cumprod(0).sum())
    if n < gamma:
        final_dist = residual_distribution(p[n], None if q is None else q[n], draft_tokens[n], lenience)
    else:
        final_dist = p[gamma]  # bonus token
    t = sample(final_dist, generator).reshape(1)  # [1]
    return torch.cat([draft_tokens[:n], t]), n


def greedy_verification(
    target_argmax: torch.Tensor, draft_tokens: torch.Tensor, lenient_ok: torch.Tensor | None = None
) -> tuple[torch.Tensor, int]:
    """The exact path for temperature 0: compare token ids instead of probabilities.

    target_argmax: [gamma + 1] long, the target's argmax after prefix, x_1, .., x_gamma.
    draft_tokens: [gamma] long.
    lenient_ok: optional [gamma] bool, True where lenience accepts x_i although it is not the argmax
      (p(x_i) >= l max p, see :func:`lenient_greedy_mask`). None is the exact rule.
    Returns (tokens, n) as :func:`speculative_sampling`: the matching prefix of the draft, then the
    target's own choice at the first mismatch (or its bonus token after gamma matches).
    """
    gamma = draft_tokens.shape[0]
    matches = target_argmax[:gamma] == draft_tokens  # [gamma] bool
    if lenient_ok is not None:
        matches = matches | lenient_ok
        n = int(matches.long().cumprod(0).sum())
        return torch.cat([draft_tokens[:n], target_argmax[n: n + 1]]), n
    n = int(matches.long().cumprod(0).sum())
    return target_argmax[: n + 1].clone(), n


def lenient_greedy_mask(logits: torch.Tensor, draft_tokens: torch.Tensor, lenience: float) -> torch.Tensor:
    """Appendix A.5 at temperature 0: x is acceptable when p(x) >= l * max(p), p = softmax(logits).

    logits: [>= gamma, V] target logits at the drafted positions; draft_tokens: [gamma]. Returns [gamma] bool.
    Computed in log space: log p(x) - log max p = logit(x) - max logit >= log l.
    """
    gamma = draft_tokens.shape[0]
    rows = logits[:gamma].float()  # [gamma, V]
    gap = rows.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1) - rows.max(-1).values  # [gamma]
    return gap >= torch.log(torch.tensor(lenience))


def acceptance_probability(p: torch.Tensor, q: torch.Tensor | None, draft_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) for each row (paper Theorem 5).

    p: [k, V]; q: [k, V], or None for one-hot drafts given by draft_tokens [k] (then beta = p(x)).
    Returns [k].
    """
    if q is None:
        return p.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return torch.minimum(p, q).sum(-1)
