"""CTC decoding (Graves et al. 2006): the labelling that a model's per-frame softmax over a vocabulary
with a blank gives an input of T frames.

A path is one symbol a frame; it collapses to a labelling by merging repeats, then dropping blanks
(``a a - a b`` -> ``a a b``), and a labelling's probability is the sum of its paths' probabilities.

- :func:`ctc_greedy`: the best path's labelling (each frame's argmax, collapsed), a batch at a time;
- :func:`ctc_prefix_beam_search`: the prefix beam search, one input at a time. Each prefix p keeps
  the mass of the paths so far that collapse to it, split by how they end: in a blank (p_b) or in
  p's last symbol l (p_nb). Over a frame of probabilities y:

      p stays, by a blank:      p_b'(p)     += (p_b + p_nb)(p) y_blank
      p stays, by l again:      p_nb'(p)    += p_nb(p) y_l
      p grows by c != l:        p_nb'(p c)  += (p_b + p_nb)(p) y_c
      p grows by l:             p_nb'(p l)  += p_b(p) y_l        (a repeat needs a blank between)

  in log space, and the ``width`` prefixes of most mass go on to the next frame. After the last,
  a prefix's p_b + p_nb is its probability as a labelling; where a prefix of it was pruned on the
  way, the paths through that prefix are missing from it (a lower bound).

Ties rank by score, then by the labelling itself (the smaller first).
"""

from __future__ import annotations

import torch
from torch import Tensor

Prefix = tuple[int, ...]
NEVER = float("-inf")  # the log of a mass that is not there


def collapse(path: list[int], blank: int) -> list[int]:
    """A path's labelling: repeats merged, then blanks dropped."""
    return [s for i, s in enumerate(path) if s != blank and (i == 0 or s != path[i - 1])]


def ctc_greedy(log_probs: Tensor, lengths: Tensor, blank: int) -> list[list[int]]:
    """(B, T, V) log-probabilities and each row's (B,) valid frames -> each row's best path, collapsed."""
    best = log_probs.argmax(dim=-1).tolist()  # (B, T): each frame's likeliest symbol (the first among equals)
    return [collapse(path[:n], blank) for path, n in zip(best, lengths.tolist())]


def ctc_prefix_beam_search(
    log_probs: Tensor, length: int, blank: int, width: int, nbest: int
) -> list[tuple[list[int], float]]:
    """(T, V) log-probabilities of one input, its first ``length`` frames valid -> the ``nbest`` best
    labellings of a prefix beam search ``width`` wide, each with its log-probability, best first."""
    prefixes: list[Prefix] = [()]  # before any frame: the empty labelling, surely, ending in no symbol
    p_b = torch.zeros(1, dtype=torch.float64)  # (P,) log mass of each prefix's paths that end in a blank
    p_nb = torch.full((1,), NEVER, dtype=torch.float64)  # (P,) ... that end in the prefix's last symbol
    for y in log_probs[:length].double().cpu():  # (V,)
        prefixes, p_b, p_nb = _frame(prefixes, p_b, p_nb, y, blank, width)
    scores = torch.logaddexp(p_b, p_nb).tolist()
    return [(list(prefix), score) for prefix, score in zip(prefixes[:nbest], scores)]


def _frame(
    prefixes: list[Prefix], p_b: Tensor, p_nb: Tensor, y: Tensor, blank: int, width: int
) -> tuple[list[Prefix], Tensor, Tensor]:
    """One frame of (V,) log-probabilities ``y`` over the beam: P prefixes and their (P,) masses ->
    the next beam, at most ``width`` prefixes, best first."""
    total = torch.logaddexp(p_b, p_nb)  # (P,)
    last = torch.tensor([prefix[-1] if prefix else blank for prefix in prefixes])  # (P,); blank: no symbol yet
    ends = (last != blank).nonzero().squeeze(1)  # (E,) the prefixes with a last symbol
    stay_b = total + y[blank]  # (P,)
    stay_nb = torch.full_like(total, NEVER)  # (P,)
    stay_nb[ends] = p_nb[ends] + y[last[ends]]
    grow = total[:, None] + y[None, :]  # (P, V): the mass of prefix i followed by symbol c
    grow[:, blank] = NEVER  # a blank adds no symbol
    grow[ends, last[ends]] = p_b[ends] + y[last[ends]]
    # A growth onto a prefix already in the beam is more of that prefix's p_nb, not a new prefix.
    index = {prefix: i for i, prefix in enumerate(prefixes)}
    known = [(i, index[p[:-1]], p[-1]) for i, p in enumerate(prefixes) if p and p[:-1] in index]
    if known:
        child, parent, symbol = torch.tensor(known).T  # (K,) each: the prefix, the one it grows from, its last symbol
        stay_nb[child] = torch.logaddexp(stay_nb[child], grow[parent, symbol])
        grow[parent, symbol] = NEVER
    # A new prefix's mass is its growth alone: only the width best (and any equal to the last) can be kept.
    edge = grow.flatten().topk(min(width, grow.numel())).values[-1]
    parent, symbol = ((grow >= edge) & (grow > NEVER)).nonzero(as_tuple=True)  # (N,) each
    new = grow[parent, symbol]  # (N,) the new prefixes' p_nb (their p_b: none yet)
    candidates = prefixes + [prefixes[i] + (c,) for i, c in zip(parent.tolist(), symbol.tolist())]
    b = torch.cat([stay_b, torch.full_like(new, NEVER)])  # (P + N,)
    nb = torch.cat([stay_nb, new])  # (P + N,)
    score = torch.logaddexp(b, nb).tolist()
    possible = (i for i, s in enumerate(score) if s > NEVER)
    kept = sorted(possible, key=lambda i: (-score[i], candidates[i]))[:width]
    rows = torch.tensor(kept, dtype=torch.long)
    return [candidates[i] for i in kept], b[rows], nb[rows]
