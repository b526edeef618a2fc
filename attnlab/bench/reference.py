"""The reference implementations the benchmarks measure attnlab against, built to the same shape:

- ``TorchTransformer``: ``torch.nn.Transformer`` with shared, sqrt(d)-scaled embeddings, sinusoidal
  positions, dropout and a tied output projection, as in the paper;
- ``marian``: Hugging Face ``MarianMTModel`` (the Marian / OPUS-MT architecture: post-norm,
  sinusoidal positions, tied embeddings), when ``transformers`` is installed (``pip install
  attnlab[bench]``); None otherwise.

A reference from an optional extra that is not installed leaves its column empty, saying why in one
line (:func:`not_installed`: the records' ``skipped_reference`` or ``skipped``, which the CLI prints).

Both take (src, tgt_in) token ids and return (B, T, V) logits; the benchmarks give them the same
batches, the same loss (label-smoothed cross-entropy) and the same optimiser as attnlab.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import TypedDict, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models import EncoderDecoderConfig, build_model
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig
from attnlab.nn.positional import sinusoid

SHAPE = dict(vocab_size=8000, d_model=256, n_heads=4, n_layers=3, d_ff=1024)  # issue 8's benchmark shape
DROPOUT = 0.1


DATA = DataShape(vocab_size=SHAPE["vocab_size"])  # the benchmark's data: one shared vocabulary


class StackSizes(TypedDict):
    """SHAPE's sizes of the stack, as StackConfig's keywords."""

    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int


def model_config(dropout: float = DROPOUT) -> EncoderDecoderConfig:
    """The benchmark's model: sinusoidal positions and tied embeddings are the config's defaults."""
    sizes = cast(StackSizes, {name: SHAPE[name] for name in ("d_model", "n_heads", "n_layers", "d_ff")})  # those keys
    return EncoderDecoderConfig(stack=StackConfig(**sizes, dropout=dropout))


def attnlab_model(dropout: float = DROPOUT) -> nn.Module:
    return build_model(model_config(dropout), DATA)


class TorchTransformer(nn.Module):
    pe: Tensor  # (max_len, d_model): the sinusoidal table, a buffer

    def __init__(
        self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float, max_len: int = 512
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        self.register_buffer("pe", sinusoid(torch.arange(max_len), d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, batch_first=True)
        self.scale = math.sqrt(d_model)

    def _embed(self, ids: Tensor) -> Tensor:
        return self.dropout(self.embed(ids) * self.scale + self.pe[: ids.shape[1]])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=tgt_in.device)
        src_pad, tgt_pad = src == 0, tgt_in == 0
        y = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return F.linear(y, self.embed.weight)  # tied output projection


def torch_transformer(dropout: float) -> TorchTransformer:
    return TorchTransformer(**SHAPE, dropout=dropout)


def installed(module: str) -> ModuleType | None:
    """``module`` imported, or None where it is not installed (an optional extra's)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def not_installed(module: str, extra: str) -> str:
    """Why a reference's column is empty: ``module`` is missing, and the extra that installs it."""
    return f"{module} is not installed (pip install 'attnlab[{extra}]')"


def missing(extra: str, *modules: str) -> str | None:
    """:func:`not_installed` for the first of ``modules`` (those of ``extra``) that does not import;
    None where they all do."""
    return next((not_installed(m, extra) for m in modules if installed(m) is None), None)


def cpu_engine_missing(device: torch.device, extra: str, *modules: str) -> str | None:
    """Why the column of a deployment engine timed on the CPU only (CTranslate2, ONNX Runtime) stays
    empty in a bench on ``device``, in one line: the bench is not on the CPU, or :func:`missing`;
    None where it runs."""
    if device.type != "cpu":
        return f"timed on the CPU only; this bench runs on {device}"
    return missing(extra, *modules)


TRANSFORMERS_MISSING = not_installed("transformers", "bench")


def transformers_or_none() -> ModuleType | None:
    """The ``transformers`` module (the Hugging Face references), or None where it is not installed."""
    return installed("transformers")


def marian(dropout: float) -> MarianWrapper | None:
    """A MarianMTModel of the benchmark shape (random weights), or None without ``transformers``."""
    if (hf := transformers_or_none()) is None:
        return None
    config = hf.MarianConfig(
        vocab_size=SHAPE["vocab_size"],
        decoder_vocab_size=SHAPE["vocab_size"],
        d_model=SHAPE["d_model"],
        encoder_layers=SHAPE["n_layers"],
        decoder_layers=SHAPE["n_layers"],
        encoder_attention_heads=SHAPE["n_heads"],
        decoder_attention_heads=SHAPE["n_heads"],
        encoder_ffn_dim=SHAPE["d_ff"],
        decoder_ffn_dim=SHAPE["d_ff"],
        activation_function="relu",
        dropout=dropout,
        attention_dropout=dropout,
        activation_dropout=0.0,
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=1,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    return MarianWrapper(hf.MarianMTModel(config))


class MarianWrapper(nn.Module):
    """(src, tgt_in) -> logits, like the other two; ``.hf`` is the MarianMTModel (for ``generate``)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.hf(
            input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt_in, decoder_attention_mask=tgt_in != 0
        ).logits
