"""`attnlab bench ...` with the training loss's target logit picked by a gather, the form before
72dc8f7, in place of nn/losses.py's traced masked sum (``target_logits``). Run beside the same bench
unpatched on the same GPU, it says what the masked sum costs or gains there: on an H200 the
gpt2-small bench gave x1.055 against GPT2LMHeadModel at fb2ca54 (gather) and x0.994 at 5e8330f
(masked sum, with split_heads' views), in two sessions (docs/performance/gpu_training_later.md). gpu_session.sh runs it
right after the unpatched bench (phase train_gpt2_small_gather):
    python docs/experiments/gather_pick_bench.py bench train --device cuda --precision bf16 --repeats 5 \
        --json --shape gpt2-small --compile
"""

from __future__ import annotations

import sys

from torch import Tensor

from attnlab.cli.main import main
from attnlab.nn import losses


def gathered(x: Tensor, target: Tensor) -> Tensor:
    """(N, V) ``x``, (N,) ``target`` -> (N,) x[n, target[n]], by a gather also when traced."""
    return x.gather(-1, target[:, None]).squeeze(-1)


if __name__ == "__main__":
    losses.target_logits = gathered  # smoothed_nll_expression looks it up as a module global
    sys.exit(main(sys.argv[1:]))
