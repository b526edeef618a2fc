"""Marian's weights by attnlab's names, both ways: every tensor of a Marian-shaped encoder_decoder and
the Marian tensors it is made of (separate query, key and value projections concatenated into attnlab's
fused ones), and the import's checks and token rows; the converter is interop/marian.py.

    model.shared                              src_embed.tokens (= tgt_embed.tokens = generator; rows renumbered)
    final_logits_bias                         generator.bias
    model.encoder.layers.i.self_attn.{q,k,v}_proj     encoder.layers.i.self_attn.qkv_proj
    model.encoder.layers.i.self_attn.out_proj         encoder.layers.i.self_attn.out_proj
    model.encoder.layers.i.self_attn_layer_norm       encoder.layers.i.self_attn_residual.norm
    model.encoder.layers.i.fc1, fc2                   encoder.layers.i.feed_forward.w_1, w_2
    model.encoder.layers.i.final_layer_norm           encoder.layers.i.feed_forward_residual.norm
    model.decoder.layers.i.(the same)                 decoder.layers.i.(the same)
    model.decoder.layers.i.encoder_attn.q_proj        decoder.layers.i.cross_attn.q_proj
    model.decoder.layers.i.encoder_attn.{k,v}_proj    decoder.layers.i.cross_attn.kv_proj
    model.decoder.layers.i.encoder_attn.out_proj      decoder.layers.i.cross_attn.out_proj
    model.decoder.layers.i.encoder_attn_layer_norm    decoder.layers.i.cross_attn_residual.norm
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.errors import CheckpointError
from attnlab.models.encoder_decoder import EncoderDecoderConfig


def layer_pairs(stack: str, n_layers: int, cross: bool) -> dict[str, tuple[str, ...]]:
    """attnlab's name -> the Marian names it is made of (several: fused, in order) for one stack's layers."""
    pairs: dict[str, tuple[str, ...]] = {}
    for i in range(n_layers):
        ours, theirs = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
        blocks = {
            "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "self_attn.out_proj": ("self_attn.out_proj",),
            "self_attn_residual.norm": ("self_attn_layer_norm",),
            "feed_forward.w_1": ("fc1",),
            "feed_forward.w_2": ("fc2",),
            "feed_forward_residual.norm": ("final_layer_norm",),
        }
        if cross:
            blocks |= {
                "cross_attn.q_proj": ("encoder_attn.q_proj",),
                "cross_attn.kv_proj": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
                "cross_attn.out_proj": ("encoder_attn.out_proj",),
                "cross_attn_residual.norm": ("encoder_attn_layer_norm",),
            }
        for block, parts in blocks.items():
            for kind in ("weight", "bias"):
                pairs[f"{ours}{block}.{kind}"] = tuple(f"{theirs}{part}.{kind}" for part in parts)
    return pairs


def tensor_pairs(cfg: EncoderDecoderConfig) -> dict[str, tuple[str, ...]]:
    """Every attnlab tensor of a Marian-shaped encoder_decoder -> its Marian tensors."""
    return (
        {"src_embed.tokens.weight": ("model.shared.weight",), "generator.bias": ("final_logits_bias",)}
        | layer_pairs("encoder", cfg.encoder_layers, cross=False)
        | layer_pairs("decoder", cfg.decoder_layers, cross=True)
    )


def shared_embedding(weights: dict[str, torch.Tensor], where: Path) -> torch.Tensor:
    """The one token table, whichever of its tied names the file kept (safetensors saves a tied
    tensor once); every copy there must equal it."""
    names = [
        n
        for n in (
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        )
        if n in weights
    ]
    if not names:
        raise CheckpointError(f"{where}: no model.shared.weight, which a Marian model has")
    different = [n for n in names[1:] if not torch.equal(weights[n], weights[names[0]])]
    if different:
        raise CheckpointError(f"{where}: {different[0]} differs from {names[0]}; attnlab's Marian shares one table")
    return weights[names[0]]


def expected_shape(name: str, ours: tuple[int, ...], parts: int, vocab: int) -> tuple[int, ...]:
    """The shape of each of the ``parts`` Marian tensors that make attnlab's tensor ``name`` of shape
    ``ours`` (the token table and the output bias: Marian's ``vocab`` rows, without the added <bos>)."""
    vocabulary = {"src_embed.tokens.weight": (vocab, *ours[1:]), "generator.bias": (1, vocab)}
    return vocabulary.get(name, (ours[0] // parts, *ours[1:]))


def marian_tensors(
    weights: dict[str, torch.Tensor],
    cfg: EncoderDecoderConfig,
    shapes: dict[str, tuple[int, ...]],
    order: list[int | None],
    start: int,
    where: Path,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors (of ``shapes``) from a MarianMTModel / MarianModel state dict, token rows
    taken in ``order`` (the added <bos>, None there: the decoder ``start``'s row); and the names of
    the original that have no place here. A missing tensor or a shape unlike config.json's is
    refused in one line."""
    plain = dict(weights) | {"model.shared.weight": shared_embedding(weights, where)}
    vocab = sum(old is not None for old in order)  # Marian's tokens, without an added <bos>
    plain.setdefault("final_logits_bias", torch.zeros(1, vocab))  # MarianModel: no output bias
    out, used = {}, set()
    for ours, theirs in tensor_pairs(cfg).items():
        missing = [name for name in theirs if name not in plain]
        if missing:
            raise CheckpointError(f"{where}: no tensor {missing[0]}, which config.json's Marian has")
        shape = expected_shape(ours, shapes[ours], len(theirs), vocab)
        for name in theirs:
            if tuple(plain[name].shape) != shape:
                raise CheckpointError(
                    f"{where}: {name} has shape {tuple(plain[name].shape)}; config.json gives {shape}"
                )
        out[ours] = torch.cat([plain[name].float() for name in theirs])
        used |= set(theirs)
    rows = torch.tensor([start if old is None else old for old in order])
    out["generator.bias"] = out["generator.bias"].flatten()[rows]
    out["src_embed.tokens.weight"] = out["src_embed.tokens.weight"][rows]
    tied = {
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    }  # copies; fixed sinusoids
    return out, [name for name in weights if name not in used | tied]
