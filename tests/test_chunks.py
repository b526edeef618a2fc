"""Encoding in overlapping chunks (nn/chunks.py): the windows and which window each position takes
its vector from, against a brute-force reference; a chunk covering the input is the whole-input
encoding exactly (encoder-decoder and encoder-only); smaller chunks equal encoding each window alone."""

from __future__ import annotations

import pytest
import torch

from attnlab.decode.search import greedy
from attnlab.nn.chunks import Chunking, chunked_encoding

from helpers import random_ids, tiny_model


def test_windows_step_by_size_less_overlap_and_the_last_ends_at_the_end():
    assert Chunking(4, 1).windows(10) == [(0, 4), (3, 7), (6, 10)]
    assert Chunking(4, 0).windows(10) == [(0, 4), (4, 8), (6, 10)]
    assert Chunking(16, 8).windows(10) == [(0, 10)]
    assert Chunking(5, 2).windows(8) == [(0, 5), (3, 8)]


@pytest.mark.parametrize("size, overlap, length", [(4, 1, 10), (5, 2, 13), (3, 0, 7), (6, 5, 9)])
def test_each_position_takes_the_window_with_the_most_context(size, overlap, length):
    chunking = Chunking(size, overlap)
    windows = chunking.windows(length)
    for pos, owner in enumerate(chunking.owners(length).tolist()):
        contexts = [min(pos - a, b - 1 - pos) if a <= pos < b else -1 for a, b in windows]
        assert owner == contexts.index(max(contexts))


@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_only"])
def test_a_chunk_covering_the_input_is_the_whole_encoding(arch):
    model = tiny_model(arch=arch)
    ids = random_ids(3, 11)
    whole = model.encode(ids)
    with chunked_encoding(model, Chunking(11, 0)):
        chunked = model.encode(ids)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
    assert "encode" not in vars(model)  # the model's own encode again


@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_only"])
def test_smaller_chunks_equal_each_window_encoded_alone(arch):
    model = tiny_model(arch=arch)
    ids = random_ids(2, 13)
    chunking = Chunking(5, 2)

    def alone(window: slice) -> torch.Tensor:
        out = model.encode(ids[:, window])
        return out[0] if arch == "encoder_decoder" else out

    expected = torch.empty_like(alone(slice(0, 13)))
    for pos, owner in enumerate(chunking.owners(13).tolist()):
        a, b = chunking.windows(13)[owner]
        expected[:, pos] = alone(slice(a, b))[:, pos - a]
    with chunked_encoding(model, chunking):
        got = model.encode(ids)
        if arch == "encoder_decoder":
            got, valid = got
            assert valid.equal(ids != model.pad_id)
            assert len(greedy(model, ids, max_len=5)) == 2  # decoding reads the chunked memory
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(got, alone(slice(0, 13)), atol=1e-3)  # and differs from the whole encoding


def test_chunks_need_an_overlap_below_their_size():
    with pytest.raises(ValueError, match=r"0 <= overlap < size \(got size 4, overlap 4\)"):
        Chunking(4, 4)
