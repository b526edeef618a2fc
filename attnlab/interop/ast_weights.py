"""The AST's weights by attnlab's names, both ways; the converter is interop/ast.py. Its encoder is
ViT's, named as ViT's (interop/vit_weights.py's ``vit_pairs``) under ``audio_spectrogram_transformer.``;
the patch projection (a Conv2d of one channel), the positions and the two tokens are reshaped, not
renamed:

    embeddings.patch_embeddings.projection.weight   patch_embed.projection.weight (flattened)
    embeddings.position_embeddings[2:]              positional.table (the patches' positions)
    embeddings.{cls,distillation}_token + position_embeddings[:2]   summary.token (each at its position)
    classifier.layernorm, classifier.dense          classifier.norm, classifier.out (ASTMLPHead)
"""

from __future__ import annotations

import torch

from attnlab.interop.vit_weights import vit_pairs

PREFIX = "audio_spectrogram_transformer."
CONV, POSITIONS, CLS, DISTIL = (
    f"{PREFIX}embeddings.patch_embeddings.projection.weight",
    f"{PREFIX}embeddings.position_embeddings",
    f"{PREFIX}embeddings.cls_token",
    f"{PREFIX}embeddings.distillation_token",
)
HEAD = {
    "classifier.norm.weight": "classifier.layernorm.weight",
    "classifier.norm.bias": "classifier.layernorm.bias",
    "classifier.out.weight": "classifier.dense.weight",
    "classifier.out.bias": "classifier.dense.bias",
}


def ast_pairs(n_layers: int) -> dict[str, tuple[str, ...]]:
    """attnlab's tensor name -> the AST names it is made of (query, key, value: one fused tensor)."""
    encoder = {
        ours: tuple(PREFIX + name for name in theirs)
        for ours, theirs in vit_pairs(n_layers).items()
        if not ours.startswith("classifier.")  # ViT's heads; the AST's is HEAD
    }
    return encoder | {ours: (theirs,) for ours, theirs in HEAD.items()}


def ast_tensors(weights: dict[str, torch.Tensor], n_layers: int) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors from an ASTForAudioClassification state dict, and the names that have no place here."""
    plain = {name: t.float() for name, t in weights.items()}
    out, used = {}, set()
    for ours, theirs in ast_pairs(n_layers).items():
        if all(name in plain for name in theirs):
            out[ours] = torch.cat([plain[name] for name in theirs])
            used |= set(theirs)
    if CONV in plain:
        out["patch_embed.projection.weight"] = plain[CONV].flatten(1)  # (d, 1, P, P) -> (d, P P)
        used.add(CONV)
    if {POSITIONS, CLS, DISTIL} <= set(plain):
        out["positional.table.weight"] = plain[POSITIONS][0, 2:]  # (N, d): the patches'
        tokens = torch.cat([plain[CLS], plain[DISTIL]], dim=1)  # (1, 2, d)
        out["summary.token"] = tokens + plain[POSITIONS][:, :2]  # each token at its position
        used |= {POSITIONS, CLS, DISTIL}
    return out, [name for name in weights if name not in used]


def hf_tensors(state: dict[str, torch.Tensor], n_layers: int, patch_size: int) -> dict[str, torch.Tensor]:
    """The AST's tensors from attnlab's (``state``): the fused projections cut, the patch projection a
    Conv2d's weight again, the tokens holding their positions (whose own rows are zero)."""
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in ast_pairs(n_layers).items():
        out |= dict(zip(theirs, state[ours].chunk(len(theirs))))
    d = state["summary.token"].shape[-1]
    out[CONV] = state["patch_embed.projection.weight"].view(d, 1, patch_size, patch_size)
    out[POSITIONS] = torch.cat([torch.zeros(2, d), state["positional.table.weight"]])[None]  # (1, 2 + N, d)
    out[CLS], out[DISTIL] = state["summary.token"][:, :1], state["summary.token"][:, 1:]
    return out
