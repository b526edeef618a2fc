"""Hugging Face ViT's weights by attnlab's names, both ways (:func:`vit_pairs`; query, key and value
concatenated into the fused projection), and the import's tensors (:func:`vit_tensors`); the patch
projection's weight, the positions and the class token are reshaped, not renamed (:data:`EMBEDDINGS`). The
converter is interop/vit.py, whose docstring says why the class token holds its position.

    embeddings.patch_embeddings.projection    patch_embed.projection (the Conv2d's weight flattened)
    embeddings.position_embeddings[1:]        positional.table (the patches' positions)
    embeddings.cls_token + position_embeddings[0]   summary.token (the class token at its position)
    encoder.layer.i.layernorm_before          encoder.layers.i.self_attn_residual.norm
    encoder.layer.i.attention.attention.{query,key,value}   encoder.layers.i.self_attn.qkv_proj
    encoder.layer.i.attention.output.dense    encoder.layers.i.self_attn.out_proj
    encoder.layer.i.layernorm_after           encoder.layers.i.feed_forward_residual.norm
    encoder.layer.i.intermediate.dense        encoder.layers.i.feed_forward.w_1
    encoder.layer.i.output.dense              encoder.layers.i.feed_forward.w_2
    layernorm                                 encoder.norm
    pooler.dense                              classifier.pool (ViTModel)
    classifier                                classifier.out (ViTForImageClassification)
"""

from __future__ import annotations

import torch

LAYER_PARTS = {
    "layernorm_before": "self_attn_residual.norm",
    "attention.output.dense": "self_attn.out_proj",
    "layernorm_after": "feed_forward_residual.norm",
    "intermediate.dense": "feed_forward.w_1",
    "output.dense": "feed_forward.w_2",
}


def vit_pairs(n_layers: int) -> dict[str, tuple[str, ...]]:
    """attnlab's tensor name -> the ViT names it is made of (ViTModel's, without the ``vit.`` prefix of
    ViTForImageClassification; query, key, value: one fused tensor). The patch projection's weight,
    the positions and the class token are reshaped, not renamed (:data:`EMBEDDINGS`)."""
    pairs = {
        "patch_embed.projection.bias": "embeddings.patch_embeddings.projection.bias",
        "encoder.norm.weight": "layernorm.weight",
        "encoder.norm.bias": "layernorm.bias",
        "classifier.pool.weight": "pooler.dense.weight",
        "classifier.pool.bias": "pooler.dense.bias",
        "classifier.out.weight": "classifier.weight",
        "classifier.out.bias": "classifier.bias",
    }
    fused = {}
    for i in range(n_layers):
        for kind in ("weight", "bias"):
            pairs |= {
                f"encoder.layers.{i}.{ours}.{kind}": f"encoder.layer.{i}.{theirs}.{kind}"
                for theirs, ours in LAYER_PARTS.items()
            }
            fused[f"encoder.layers.{i}.self_attn.qkv_proj.{kind}"] = tuple(
                f"encoder.layer.{i}.attention.attention.{p}.{kind}" for p in ("query", "key", "value")
            )
    return {ours: (theirs,) for ours, theirs in pairs.items()} | fused


CONV, POSITIONS, CLS = (
    "embeddings.patch_embeddings.projection.weight",
    "embeddings.position_embeddings",
    "embeddings.cls_token",
)
EMBEDDINGS = (CONV, POSITIONS, CLS)  # (d, C, P, P) conv; (1, 1 + N, d) positions, the class token's first; (1, 1, d)


def vit_tensors(weights: dict[str, torch.Tensor], n_layers: int) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors from a ViT state dict (ViTForImageClassification's ``vit.`` prefix dropped);
    and the names of the original that have no place here."""
    plain = {name.removeprefix("vit."): t.float() for name, t in weights.items()}
    out, used = {}, set()
    for ours, theirs in vit_pairs(n_layers).items():
        if all(name in plain for name in theirs):
            out[ours] = torch.cat([plain[name] for name in theirs])
            used |= set(theirs)
    if CONV in plain:
        out["patch_embed.projection.weight"] = plain[CONV].flatten(1)  # (d, C, P, P) -> (d, C P P), (c, row, col)
        used.add(CONV)
    if POSITIONS in plain and CLS in plain:
        out["positional.table.weight"] = plain[POSITIONS][0, 1:]  # (N, d): the patches'
        out["summary.token"] = plain[CLS] + plain[POSITIONS][:, :1]  # (1, 1, d): the class token at its position
        used |= {POSITIONS, CLS}
    return out, [name for name in weights if name.removeprefix("vit.") not in used]
