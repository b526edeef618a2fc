"""BERT's weights by attnlab's names, both ways (:func:`bert_pairs`: the separate query, key and value
projections concatenated into the fused one), and the import's tensors: :func:`bert_tensors`, the rows
of the embedding and of the output bias in the new order of their tokens (interop/bert.py renumbers the
tokenizer), and :func:`load_bert`, which copies them into an encoder. The converter is interop/bert.py.

    embeddings.word_embeddings            embed.tokens (rows renumbered: interop/bert.py)
    embeddings.position_embeddings        embed.positional.table
    embeddings.token_type_embeddings      embed.segments
    embeddings.LayerNorm                  embed.norm
    encoder.layer.i.attention.self.{query,key,value}   encoder.layers.i.self_attn.qkv_proj
    encoder.layer.i.attention.output.dense             encoder.layers.i.self_attn.out_proj
    encoder.layer.i.attention.output.LayerNorm         encoder.layers.i.self_attn_residual.norm
    encoder.layer.i.intermediate.dense                 encoder.layers.i.feed_forward.w_1
    encoder.layer.i.output.dense                       encoder.layers.i.feed_forward.w_2
    encoder.layer.i.output.LayerNorm                   encoder.layers.i.feed_forward_residual.norm
    pooler.dense                          classifier.pool
    cls.predictions.transform.dense       mlm_head.transform
    cls.predictions.transform.LayerNorm   mlm_head.norm
    cls.predictions.bias                  mlm_head.bias (renumbered; the output matrix is the tied embedding)
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.nn.encoder_only import EncoderOnly
from attnlab.runs.init import copy_tensors, named_tensors


def bert_pairs(n_layers: int) -> dict[str, tuple[str, ...]]:
    """attnlab's tensor name -> the BERT names it is made of (query, key, value: one fused tensor)."""
    pairs = {
        "embed.tokens.weight": "embeddings.word_embeddings.weight",
        "embed.positional.table.weight": "embeddings.position_embeddings.weight",
        "embed.segments.weight": "embeddings.token_type_embeddings.weight",
        "embed.norm.weight": "embeddings.LayerNorm.weight",
        "embed.norm.bias": "embeddings.LayerNorm.bias",
        "classifier.pool.weight": "pooler.dense.weight",
        "classifier.pool.bias": "pooler.dense.bias",
        "mlm_head.transform.weight": "cls.predictions.transform.dense.weight",
        "mlm_head.transform.bias": "cls.predictions.transform.dense.bias",
        "mlm_head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
        "mlm_head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
        "mlm_head.bias": "cls.predictions.bias",
    }
    fused = {}
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            pairs |= {
                f"{ours}self_attn.out_proj.{kind}": f"{theirs}attention.output.dense.{kind}",
                f"{ours}self_attn_residual.norm.{kind}": f"{theirs}attention.output.LayerNorm.{kind}",
                f"{ours}feed_forward.w_1.{kind}": f"{theirs}intermediate.dense.{kind}",
                f"{ours}feed_forward.w_2.{kind}": f"{theirs}output.dense.{kind}",
                f"{ours}feed_forward_residual.norm.{kind}": f"{theirs}output.LayerNorm.{kind}",
            }
            fused[f"{ours}self_attn.qkv_proj.{kind}"] = tuple(
                f"{theirs}attention.self.{p}.{kind}" for p in ("query", "key", "value")
            )
    return {ours: (theirs,) for ours, theirs in pairs.items()} | fused


VOCABULARY_ROWS = ("embed.tokens.weight", "mlm_head.bias")  # one row per token: renumbered


def bert_tensors(
    weights: dict[str, torch.Tensor], n_layers: int, order: list[int]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors from a BERT state dict (``bert.`` prefixes of the *For... models dropped),
    embedding rows in the new ``order``; and the names of the original that have no place here."""
    plain = {name.removeprefix("bert."): t for name, t in weights.items()}
    out, used = {}, set()
    for ours, theirs in bert_pairs(n_layers).items():
        if all(name in plain for name in theirs):
            out[ours] = torch.cat([plain[name] for name in theirs])
            used |= set(theirs)
    for name in VOCABULARY_ROWS:
        if name in out:
            out[name] = out[name][order]
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}  # the embedding and the bias again
    unused = [
        name for name in weights if name.removeprefix("bert.") not in used | tied and not name.endswith("position_ids")
    ]  # position_ids: a buffer of 0..max_len-1
    return out, unused


def load_bert(
    model: EncoderOnly, weights: dict[str, torch.Tensor], order: list[int], where: Path | str
) -> tuple[list[str], list[str], list[str]]:
    """Copy a BERT state dict into attnlab's encoder ``model`` (embedding rows in ``order``): the
    names of its tensors loaded and left new, and of the original's that have no place here."""
    tensors, unused = bert_tensors(weights, len(model.encoder.layers), order)
    target = named_tensors(model)
    loaded = copy_tensors(target, tensors, str(where))
    return loaded, [name for name in target if name not in tensors], unused
