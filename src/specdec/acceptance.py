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

Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025;
``verification="block"``) decides on the whole block at once instead of token by token: with the running
ratio p_0 = 1, p_i = min(1, p_{i-1} p(x_i) / q(x_i)), it keeps the longest prefix i whose draw eta_i falls
under h_i = Z_i / (Z_i + 1 - p_i), Z_i = sum_x max(0, p_i p_i(x) - q_i(x)) (h_gamma = p_gamma), and
replaces the next token by a sample from norm(max(0, p_tau p_tau(.) - q_tau(.))), or adds the bonus token
after a whole block. The output is still exactly p's, and it accepts at least as many tokens in
expectation as token verification. With a one-hot q (a draft without probabilities) and at temperature 0
it is token verification (:func:`verify` runs that path).

Lenience l in (0, 1] (paper Appendix A.5) multiplies q by l before it is compared with p: token x is
accepted with probability min(1, p(x) / (l q(x))) and the residual is norm(max(0, p - l q)). No token
is then emitted with probability above p(x) / l; l = 1 is the exact algorithm. At temperature 0,
lenience accepts x when p(x) >= l * max(p) on the unstandardized distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.sampling import SamplingParams, sample, standardize, uniform

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
    positions = torch.arange(gamma, device=p.device)
    p_x = p[positions, draft_tokens]  # [gamma]
    q_x = q[positions, draft_tokens] if q is not None else torch.ones_like(p_x)  # [gamma]
    r = torch.rand(gamma, generator=generator, dtype=p_x.dtype, device=p.device)  # [gamma], U[0, 1)
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
    return gap >= math.log(lenience)


def acceptance_probability(p: torch.Tensor, q: torch.Tensor | None, draft_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) for each row (paper Theorem 5).

    p: [k, V]; q: [k, V], or None for one-hot drafts given by draft_tokens [k] (then beta = p(x)).
    Returns [k].
    """
    if q is None:
        return p.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return torch.minimum(p, q).sum(-1)


@dataclass
class Verification:
    """The outcome of verifying one draft, as device tensors (reading them is the round's one sync).

    tokens: [gamma + 1] long; tokens[:n] are the accepted draft tokens, tokens[n] the target's token
      (residual or bonus); entries after n are padding.
    n: [] long, the number of accepted draft tokens.
    betas: [gamma] float, beta = sum_x min(p(x), q(x)) at each drafted position (Theorem 5; at
      temperature 0: 1 where the draft token is the target's choice). Only the first min(n + 1, gamma)
      were verified: the statistics use those.
    p: [gamma + 1, V] the standardized target distributions when sampling (None at temperature 0).
    """

    tokens: torch.Tensor
    n: torch.Tensor
    betas: torch.Tensor
    p: torch.Tensor | None = None

    def read(self) -> tuple[list[int], int, list[float]]:
        """(emitted tokens, n, verified betas) on the host: one device-to-host copy."""
        gamma = self.betas.shape[0]
        packed = torch.cat([self.n.reshape(1).double(), self.tokens.double(), self.betas.double()]).tolist()
        n = int(packed[0])
        tokens = [int(t) for t in packed[1: n + 2]]
        return tokens, n, packed[2 + gamma: 2 + gamma + min(n + 1, gamma)]


def read_batch(results: Sequence[Verification], drafted: Sequence[torch.Tensor] | None = None
               ) -> list[tuple[list[int], int, list[float], list[int]]]:
    """Every row's (emitted tokens, n, verified betas, drafted ids) in one device-to-host copy for a batch
    (:mod:`specdec.batch.engine`); drafted ids only when ``drafted`` ([g_i] per row) is given, else []."""
    parts = []
    for i, r in enumerate(results):
        parts += [r.n.reshape(1).double(), r.tokens.double(), r.betas.double()]
        if drafted is not None:
            parts.append(drafted[i].double())
    packed = torch.cat(parts).tolist()
    out, at = [], 0
    for i, r in enumerate(results):
        gamma = r.betas.shape[0]
        n = int(packed[at])
        tokens = [int(t) for t in packed[at + 1: at + n + 2]]
        betas = packed[at + 2 + gamma: at + 2 + gamma + min(n + 1, gamma)]
        at += 1 + (gamma + 1) + gamma
        ids: list[int] = []
        if drafted is not None:
            ids = [int(t) for t in packed[at: at + drafted[i].shape[0]]]
            at += drafted[i].shape[0]
        out.append((tokens, n, betas, ids))
    return out


VERIFICATIONS = ("token", "block")


def block_acceptance(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor,
                     eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's decision (Sun et al. 2025, Algorithm 2), on the device.

    p: [gamma + 1, V] target distributions; q: [gamma, V] draft distributions; draft_tokens: [gamma];
    eta: [gamma] uniform draws. Returns (tau, ratio): tau [] long, the number of drafted tokens accepted,
    and ratio [gamma + 1], the running ratio p_0 = 1, p_i = min(1, p_{i-1} p(x_i) / q(x_i)).
    """
    gamma = draft_tokens.shape[0]
    rows = torch.arange(gamma, device=p.device)
    p_x, q_x = p[rows, draft_tokens], q[rows, draft_tokens]  # [gamma]
    # log p_i = S_i - max(S_0..S_i) with S the cumulative sum of log(p/q) and S_0 = 0: the clipped recursion
    log_ratio = torch.log(p_x) - torch.log(q_x)  # -inf where the target gives x_i no mass
    s = torch.cat([log_ratio.new_zeros(1), torch.cumsum(log_ratio, 0)])  # [gamma + 1]
    ratio = torch.exp(s - torch.cummax(s, 0).values).nan_to_num(nan=0.0)  # [gamma + 1]
    z = (ratio[:gamma, None] * p[:gamma] - q).clamp_min(0.0).sum(-1)  # [gamma]: Z_i for i = 0..gamma-1
    denominator = z + 1.0 - ratio[:gamma]
    h = torch.where(denominator > 0, z / denominator.clamp_min(1e-30), torch.ones_like(z))  # [gamma], h_0 unused
    h = torch.cat([h[1:], ratio[gamma:]])  # [gamma]: h_1 .. h_{gamma-1}, then h_gamma = p_gamma
    steps = torch.arange(1, gamma + 1, device=p.device)  # [gamma]
    tau = torch.where(eta <= h, steps, torch.zeros_like(steps)).max()  # the longest prefix whose draw passes
    return tau, ratio


def verify(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
    lenience: float = 1.0,
    verification: str = "token",
) -> Verification:
    """Algorithm 1's verification of one draft, computed on the logits' device without a host sync.

    logits: [gamma + 1, V] the target's raw logits after prefix, x_1, .., x_gamma.
    draft_tokens: [gamma] long; q: [gamma, V] the draft's standardized distributions, or None for a
    one-hot draft. At temperature 0 token ids are compared (:func:`greedy_verification`); otherwise
    speculative sampling (:func:`speculative_sampling`, Appendix A.1) runs with the same random draws
    in the same order, so on CPU it returns the very tokens the reference functions return.
    Lenience l < 1 is Appendix A.5 (not exact). ``verification="block"`` is block verification (see the
    module docstring; with q None or at temperature 0 it is token verification).
    """
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {', '.join(VERIFICATIONS)}, got {verification!r}")
    gamma = draft_tokens.shape[0]
    device = logits.device
    index = torch.arange(gamma + 1, device=device)  # [gamma + 1]
    padded = torch.cat([draft_tokens, draft_tokens.new_zeros(1)])  # [gamma + 1]
    if sampling.greedy:
        target_argmax = logits.argmax(dim=-1)  # [gamma + 1]
        ok = target_argmax[:gamma] == draft_tokens  # [gamma]
        if lenience < 1.0 and gamma:
            ok = ok | lenient_greedy_mask(logits, draft_tokens, lenience)
        n = ok.long().cumprod(0).sum()  # []
        tokens = torch.where(index < n, padded, target_argmax)  # accepted drafts, then the target's choice
        return Verification(tokens, n, ok.float())

    p = standardize(logits, sampling)  # [gamma + 1, V]
    if verification == "block" and q is not None and gamma and lenience == 1.0:
        return _verify_block(p, q, draft_tokens, generator, index, padded)
    p_x = p[index[:gamma], draft_tokens]  # [gamma]
    q_x = q[index[:gamma], draft_tokens] if q is not None else torch.ones_like(p_x)  # [gamma]
    r = uniform(gamma, generator, p_x.dtype, device)  # [gamma], U[0, 1)
    n = (r * (lenience * q_x) < p_x).long().cumprod(0).sum()  # []
    p_n = p.index_select(0, n.reshape(1))[0]  # [V] target row at the first rejection (or the bonus row)
    if q is None:  # one-hot q: remove l from the rejected token's probability
        x_n = padded.index_select(0, n.reshape(1))  # [1]
        residual = p_n.scatter(0, x_n, (p_n.gather(0, x_n) - lenience).clamp_min(0.0))
    else:
        q_padded = torch.cat([q, q.new_zeros(1, q.shape[-1])])  # [gamma + 1, V]
        residual = (p_n - lenience * q_padded.index_select(0, n.reshape(1))[0]).clamp_min(0.0)
    tokens = _emit(p_n, residual, n, generator, index, padded)
    if lenience < 1.0:  # Appendix A.5: sum_x min(p(x) / l, q(x))
        betas = acceptance_probability(p[:gamma] / lenience, q, draft_tokens).clamp(max=1.0)
    else:
        betas = acceptance_probability(p[:gamma], q, draft_tokens)
    return Verification(tokens, n, betas, p)


def _verify_block(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator | None,
                  index: torch.Tensor, padded: torch.Tensor) -> Verification:
    """Block verification of a sampled draft: p [gamma + 1, V], q [gamma, V] (see :func:`block_acceptance`)."""
    gamma = draft_tokens.shape[0]
    eta = uniform(gamma, generator, p.dtype, p.device)  # [gamma], U[0, 1)
    tau, ratio = block_acceptance(p, q, draft_tokens, eta)
    p_tau = p.index_select(0, tau.reshape(1))[0]  # [V]
    q_padded = torch.cat([q, q.new_zeros(1, q.shape[-1])])  # [gamma + 1, V]
    residual = (ratio.index_select(0, tau.reshape(1)) * p_tau - q_padded.index_select(0, tau.reshape(1))[0]).clamp_min(0.0)
    tokens = _emit(p_tau, residual, tau, generator, index, padded)
    return Verification(tokens, tau, acceptance_probability(p[:gamma], q, draft_tokens), p)


def _emit(p_n: torch.Tensor, residual: torch.Tensor, n: torch.Tensor, generator: torch.Generator | None,
          index: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """The round's tokens [gamma + 1]: the n accepted drafts (``padded``), then one token sampled from the
    normalized ``residual`` [V] (p_n itself where it has no mass, as residual_distribution), or after a
    whole block (n = gamma) the bonus token from p_n = p_{gamma + 1}."""
    gamma = index.shape[0] - 1
    mass = residual.sum()
    residual = torch.where(mass <= RESIDUAL_EPS, p_n, residual / mass)
    final = torch.where(n == gamma, p_n, residual)
    t = sample(final, generator)  # []
    return torch.where(index < n, padded, t)
