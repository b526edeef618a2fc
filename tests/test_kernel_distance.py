"""How far PyTorch's fused kernel is from a GPT block: at most 4 Python frames of attnlab's code
from ``DecoderLayer.forward`` (the first) to the call of ``F.scaled_dot_product_attention``, for
every positional scheme, cache mode (none, growing, static; Transformer-XL's memory and its
decoding cache), norm placement and attention backend (issue 61). nanoGPT takes 1, litgpt 2,
torchtune 3; attnlab took 8 (block, residual, lambda, SelfAttention, attend, auto, backend, sdpa's
compute). ``nn.Module.__call__`` and the other frames of torch's own code do not count."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import FrameType

import pytest
import torch

import attnlab
from attnlab.errors import ConfigError
from attnlab.nn.layers import DecoderLayer
from attnlab.nn.registry import ATTENTION_BACKENDS, NORM_PLACEMENTS, POSITIONAL

from helpers import random_ids, tiny_model

MOST_FRAMES = 4
PACKAGE = Path(attnlab.__file__).parent
CACHES = {  # how a decoder_lm's self-attention keys are kept: not at all, growing, or preallocated
    "none": lambda model: None,
    "dynamic": lambda model: model.new_cache(),
    "static": lambda model: model.new_cache(capacity=16),
}
# The backends whose kernel is PyTorch's on the device: 'chunked' hands attention with no mask matrix
# to it on CUDA. 'auto' computes with 'math' where the weights are needed (Shaw's value term).
CALL_SDPA = {"cpu": {"sdpa", "auto"}, "cuda": {"sdpa", "auto", "chunked"}}
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def frames_from_block(frame: FrameType) -> list[str]:
    """The attnlab frames from the innermost DecoderLayer.forward down to ``frame`` (the caller of
    the kernel), outermost first, as 'file:function'; [] when no block is on the stack."""
    ours = []
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            ours.append(f"{path.relative_to(PACKAGE)}:{frame.f_code.co_qualname}")
            if frame.f_code.co_name == "forward" and isinstance(frame.f_locals.get("self"), DecoderLayer):
                return ours[::-1]
        frame = frame.f_back
    return []


@pytest.fixture
def kernel_calls(monkeypatch) -> list[list[str]]:
    """Each call of F.scaled_dot_product_attention (as the backends call it, through the module
    attribute) records the attnlab frames from the block to it."""
    calls, kernel = [], torch.nn.functional.scaled_dot_product_attention

    def recorded(*args, **kwargs):
        calls.append(frames_from_block(inspect.stack(context=0)[1].frame))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return calls


def assert_near(kernel_calls: list[list[str]], model: torch.nn.Module, backend: str, device: str) -> None:
    """The kernel was called where the backend's kernel is PyTorch's, each time at most MOST_FRAMES
    frames from the block."""
    shaws = any(m.positional.needs_probs for m in model.modules() if hasattr(m, "positional"))
    assert bool(kernel_calls) == (backend in CALL_SDPA[device] and not shaws)
    for frames in kernel_calls:
        assert frames and frames[0].endswith("DecoderLayer.forward"), frames
        assert len(frames) <= MOST_FRAMES, "\n".join(frames)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_PLACEMENTS)
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
def test_a_gpt_block_is_at_most_four_frames_from_sdpa(kernel_calls, backend, positional, cache, norm, device):
    if cache == "static" and not ATTENTION_BACKENDS[backend].static_cache:
        pytest.skip(f"attention backend '{backend}' decodes over no static cache")
    try:
        model = tiny_model(
            arch="decoder_lm", positions=dict(scheme=positional), attention_backend=backend, norm=norm
        ).to(device)
        kv = CACHES[cache](model)
    except ConfigError as error:
        pytest.skip(f"not a model attnlab builds: {error}")
    ids = random_ids(2, 6).to(device)
    with torch.no_grad():
        if kv is None:
            model(ids)
        else:
            model(ids[:, :5], cache=kv)  # the prompt, then one step after it
            model(ids[:, 5:], cache=kv)
    assert_near(kernel_calls, model, backend, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reading", ["segments", "cache"])
@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
def test_transformer_xls_blocks_are_as_near_over_their_memory(kernel_calls, backend, positional, reading, device):
    """The same blocks attend over a segment's memory (nn/memory.py: MemoryKV where the cache goes)
    and decode with a cache that forgets what leaves every window."""
    try:
        model = tiny_model(
            arch="transformer_xl",
            positions=dict(scheme=positional),
            attention_backend=backend,
            segment_length=3,
            memory_length=2,
        ).to(device)
    except ConfigError as error:
        pytest.skip(f"not a model attnlab builds: {error}")
    ids = random_ids(2, 7).to(device)
    with torch.no_grad():
        if reading == "segments":
            model(ids)  # three segments, the second and third after a memory
        else:
            cache = model.new_cache()
            for t in range(ids.shape[1]):
                model(ids[:, t : t + 1], cache=cache)
    assert_near(kernel_calls, model, backend, device)
