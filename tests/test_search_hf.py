"""Beam search against Hugging Face's on the same weights: a tiny random BART, driven through
attnlab's encoder-decoder interface, decoded by attnlab's beam_search and by transformers'
generate(num_beams=K, early_stopping=False). The two define the length penalty differently (GNMT's
((5 + |Y|) / 6)^alpha against |Y|^alpha), so they are compared without one (alpha = 0), where both
rank by log P and both stop a sentence once no live hypothesis can beat its K kept ones. They also
end a hypothesis at the length limit differently (attnlab forces EOS and scores it with its own log
P; transformers stops without EOS), so the sentences compared are those whose hypotheses all end
with EOS before it: most of them, on these models.

Random models rarely reach the case where the stopping rule matters; a tiny BART trained for a few
seconds on a SCAN-like task (long outputs over three tokens, label smoothing) does, and there
transformers' own fairseq-like rule (early_stopping=True) returns other hypotheses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BartConfig, BartForConditionalGeneration

from attnlab.decode.search import beam_search

from helpers import random_ids

PAD, BOS, EOS = 0, 1, 2
V = 23


class HFSeq2Seq(nn.Module):
    """A transformers encoder-decoder behind attnlab's EncoderDecoder interface (no cache: decoded
    with use_cache=False, every step recomputes the prefix)."""

    def __init__(self, hf: BartForConditionalGeneration) -> None:
        super().__init__()
        self.hf = hf

    def encode(self, src):
        valid = src != PAD
        return self.hf.get_encoder()(input_ids=src, attention_mask=valid).last_hidden_state, valid

    def decode(self, tokens, memory, src_valid, cache=None, last_only=False):
        return self.hf(encoder_outputs=(memory,), attention_mask=src_valid, decoder_input_ids=tokens).logits


def bart(seed: int, d_model: int, layers: int, init_std: float) -> BartForConditionalGeneration:
    config = BartConfig(
        vocab_size=V,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        dropout=0.0,
        attention_dropout=0.0,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    return BartForConditionalGeneration(config)


def tiny_bart(seed: int, eos_bias: float) -> BartForConditionalGeneration:
    model = bart(seed, d_model=16, layers=2, init_std=0.2).eval()  # wide: less uniform outputs
    model.final_logits_bias[0, EOS] = eos_bias  # sentences that end at different steps
    return model


def generate(hf: BartForConditionalGeneration, src: torch.Tensor, beam: int, limit: int, early_stopping: bool):
    """transformers' beam search: (B, beam, T) sequences without the decoder's start, (B, beam) log P."""
    with torch.no_grad():
        out = hf.generate(
            input_ids=src,
            attention_mask=src != PAD,
            num_beams=beam,
            num_return_sequences=beam,
            length_penalty=0.0,
            early_stopping=early_stopping,
            do_sample=False,
            max_new_tokens=limit + 1,
            suppress_tokens=[PAD, BOS],
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences.view(len(src), beam, -1)[:, :, 1:].tolist(), out.sequences_scores.view(len(src), beam).tolist()


def until_eos(rows: list[list[int]]) -> list[list[int]] | None:
    """Each sequence up to its EOS; None if one has none (it ran to the limit)."""
    return [seq[: seq.index(EOS)] for seq in rows] if all(EOS in seq for seq in rows) else None


@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5, 6, 7, 8])  # seed 2: with 4 beams, 3 of its 4 sentences reach the limit
@pytest.mark.parametrize("beam", [2, 4])
def test_beam_search_equals_transformers_generate(seed, beam):
    hf = tiny_bart(seed, eos_bias=1.25)
    src = random_ids(4, 6, vocab=V, generator_seed=seed)
    src[1, 3:] = PAD
    ours = beam_search(HFSeq2Seq(hf), src, beam=beam, lenpen=0.0, nbest=beam, max_len=30, use_cache=False)
    sequences, scores = generate(hf, src, beam, limit=30, early_stopping=False)
    ended = [i for i, rows in enumerate(sequences) if until_eos(rows) is not None]
    assert len(ended) >= 3, f"only sentences {ended} of 4 end before the limit: nothing much compared"
    for i in ended:
        assert [h.tokens for h in ours[i]] == until_eos(sequences[i])
        assert [h.score for h in ours[i]] == pytest.approx(scores[i], abs=1e-4)


@pytest.fixture(scope="module")
def scan_like_bart() -> BartForConditionalGeneration:
    """A BART trained for 400 steps (about 3 s) to write each source token t as two copies of
    3 + t mod 3: outputs of 4 to 16 tokens over three, with label smoothing 0.1, as the demo's SCAN
    model is trained: a confident model whose early EOS outranks every other alternative."""
    hf = bart(0, d_model=32, layers=1, init_std=0.02)
    g = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(hf.parameters(), lr=3e-3)
    for _ in range(400):
        n = torch.randint(2, 9, (64,), generator=g)  # source lengths
        src = torch.randint(3, V, (64, 8), generator=g)
        src[torch.arange(8)[None] >= n[:, None]] = PAD
        target = (src % 3 + 3).repeat_interleave(2, dim=1)  # (64, 16)
        labels = torch.where(torch.arange(16)[None] < 2 * n[:, None], target, -100)
        labels = torch.cat([labels, torch.full((64, 1), -100)], dim=1)
        labels[torch.arange(64), 2 * n] = EOS
        logits = hf(input_ids=src, attention_mask=src != PAD, labels=labels).logits
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return hf.eval()


@pytest.mark.parametrize("beam", [2, 4])
def test_on_a_confident_model_too_and_there_the_fairseq_rule_differs(scan_like_bart, beam):
    src = random_ids(8, 8, vocab=V, generator_seed=1)
    src[1, 3:] = PAD
    src[2, 5:] = PAD
    ours = beam_search(HFSeq2Seq(scan_like_bart), src, beam=beam, lenpen=0.0, nbest=beam, max_len=40, use_cache=False)
    sequences, scores = generate(scan_like_bart, src, beam, limit=40, early_stopping=False)
    for i, hyps in enumerate(ours):
        assert [h.tokens for h in hyps] == until_eos(sequences[i])
        assert [h.score for h in hyps] == pytest.approx(scores[i], abs=1e-4)
    fairseq_like, _ = generate(scan_like_bart, src, beam, limit=40, early_stopping=True)
    assert fairseq_like != sequences  # the case the stopping rule is for
