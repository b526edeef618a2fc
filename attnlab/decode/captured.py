"""A decoding step recorded once as a CUDA graph and replayed, or compiled.

A step of a small model launches hundreds of kernels of a few microseconds each; launching them
from Python costs more host time than the GPU spends running them (~4.5 ms a step at batch 32 on
an H100, issue 18). A CUDA graph records the kernels of one step with their arguments (tensor
addresses and shapes) and replays them all with one launch. That holds only if every step reads
and writes the same tensors: a static KV cache (nn/cache.py, StaticDecoderCache) and an input
buffer refilled before each replay.

On a CPU the same overhead dominates a small model's step at batch 1: Python and the dispatch of
hundreds of small operations. torch.compile (TorchInductor) turns the step into generated code;
the static cache gives it fixed shapes, so it compiles once per shape.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch
from torch import Tensor


class CapturedStep:
    """``step(tokens) -> logits``, the one-token steps replayed from a CUDA graph of one of them.

    The first call (the prompt, or BOS while the cross-attention keys are stored) runs as it is.
    The second runs eagerly on a side stream, as PyTorch asks before a capture (lazy set-ups such
    as cuBLAS workspaces must not happen while recording), and is then recorded, not run again:
    the recording mutates nothing until it is replayed. Every later call copies its tokens into
    the recorded input and replays. The logits returned are the graph's own buffer, overwritten by
    the next replay."""

    def __init__(self, step: Callable[[Tensor], Tensor]) -> None:
        self.step = step
        self.warm = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: Tensor | None = None  # (N, 1) the recorded input
        self.logits: Tensor | None = None  # (N, 1, V) the recorded output

    def __call__(self, tokens: Tensor) -> Tensor:
        """(N, t) new tokens -> (N, 1, V) logits of the token after them."""
        if self.graph is not None:
            assert self.tokens is not None and self.logits is not None  # recorded with the graph
            if tokens.shape != self.tokens.shape:
                raise ValueError(
                    f"a recorded step takes tokens of shape {tuple(self.tokens.shape)}, got {tuple(tokens.shape)}"
                )
            self.tokens.copy_(tokens)
            self.graph.replay()
            return self.logits
        if self.warm:
            return self._record(tokens)
        self.warm = True
        return self.step(tokens)

    def _record(self, tokens: Tensor) -> Tensor:
        """Run this step on a side stream, then record it; return its logits."""
        self.tokens = tokens.clone()
        stream: Callable[[torch.device], torch.cuda.Stream] = torch.cuda.Stream  # its __new__ is unannotated
        main, side = torch.cuda.current_stream(tokens.device), stream(tokens.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            logits = self.step(self.tokens)
        main.wait_stream(side)
        # torch.cuda.graph no longer collects garbage before recording (only under
        # torch.compiler.config.force_cudagraph_gc). An earlier session's graph, held in a reference
        # cycle (a session and its CapturedStep), that the collector frees while this one records
        # ends the recording: "operation not permitted when stream is capturing". Seen on an H100
        # (torch 2.11) evaluating SCAN's test splits, batch after batch; tests/test_static_cache.py.
        gc.collect()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step(self.tokens)
        return logits


class CompiledStep:
    """``step(tokens) -> logits``, the one-token steps through torch.compile; any other feed (the
    prompt, BOS with the source) runs as it is. The compiled code is kept by torch for later
    sessions of the same model and shapes: only the first decode pays for the compilation."""

    def __init__(self, step: Callable[[Tensor], Tensor]) -> None:
        self.step = step
        self.compiled = torch.compile(step, dynamic=False)

    def __call__(self, tokens: Tensor) -> Tensor:
        """(N, t) new tokens -> (N, 1, V) logits of the token after them."""
        return self.compiled(tokens) if tokens.shape[1] == 1 else self.step(tokens)
