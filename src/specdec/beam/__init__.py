"""Beam search with the target alone, speculative beam search (paper Appendix A.4), and the
student report's approximate variant (its Algorithm 2).

Notation as everywhere in specdec: p is the target M_p, q the draft M_q, gamma the number of draft
steps, w the beam width (``num_beams``), u >= w the draft's beam width (``draft_beams``).

Vocabulary:

- a *beam step* is one step of transformers' beam search: every running beam is extended by every
  token, the best 2w (more with several EOS ids) candidates by summed log-probability are kept, those
  ending in EOS (and among the best w) become *finished hypotheses* scored sum_logprobs /
  length ** length_penalty (length = generated tokens, EOS included), and the best w that did not end
  become the running beams of the next step;
- the *draft tree* of a round: level 0 is the w running beams, level k the u sequences the draft's own
  beam search keeps after k steps (EOS continuations excluded: a finished beam needs no logits);
- a *round* (exact mode) is one target forward pass over every root-to-node path of the tree, then as
  many target beam steps as the tree has logits for: a level-k beam step needs p for each of the
  target's running beams, which the pass holds when they are all nodes of level k;
- *accepted steps*: beam steps taken from the tree's levels 1..gamma (the step from level 0 uses the
  running beams, which the target needs anyway); like speculative decoding, a round yields
  accepted + 1 beam steps.

The acceptance rule (exact mode). After the target's own beam step from level k, let R be the w
running beams it selected, each a (parent beam, token) pair. The step is followed by another one
from the same pass iff every sequence of R is a node the draft kept at level k + 1 (same parent node,
same token). Then p for R is in the pass, and the next step is computed from exactly the logits plain
beam search would compute for exactly the same sequences; by induction every state (running beams,
scores, finished hypotheses, stopping flags) equals plain beam search's, so the output is identical,
whatever the draft. The draft's scores never enter a decision, only which sequences get scored.
Finished hypotheses need no logits, so an EOS candidate never has to be in the tree. This is the
paper's top_w(M_p) subset of top_u(M_q), made precise.

Identity is exact in the arithmetic of the beam step; the logits themselves come from passes of
different shapes (one token per beam vs. gamma + 1 tokens per path), which in floating point can
differ in the last bits, as in any speculative decoder. A near-tie at that level could be resolved
differently; tests in fp32 see none.

Layout: ``search.py`` (the public :func:`beam_search`, validation through
:class:`~specdec.config.GenerationConfig`), ``state.py`` (transformers' beam state), ``exact.py``
(Appendix A.4: the draft tree and the target's pass over it), ``report.py`` (the report's
Algorithm 2), ``drafts.py`` (log q of a tree level from a model or a drafter with probabilities),
``batch_kv.py`` (the batched KV cache: the core's position-indexed buffers, one row per beam or tree
path, all rows of one length; reordering beams is one row gather, rollback lowers the length).
"""

from specdec.beam.search import MODES, BeamOutput, beam_search

__all__ = ["MODES", "BeamOutput", "beam_search"]
