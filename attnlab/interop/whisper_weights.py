"""Whisper's weights by attnlab's names, both ways (:func:`whisper_pairs`), and the import's tensors
(:func:`whisper_tensors`); the converter is interop/whisper.py. The layers are named as Marian's
(interop/marian_weights.py's ``layer_pairs``: separate query, key and value projections concatenated into
attnlab's fused ones), under ``model.encoder`` and ``model.decoder``:

    model.encoder.conv1, conv2                stem.conv1, conv2
    model.encoder.embed_positions             (none: Whisper's sinusoids, computed; checked on import)
    model.encoder.layers.i.*                  encoder.layers.i.* (as Marian's)
    model.encoder.layer_norm                  encoder.norm
    model.decoder.embed_tokens (= proj_out)   tgt_embed.tokens (= generator)
    model.decoder.embed_positions             tgt_embed.positional.table
    model.decoder.layers.i.*                  decoder.layers.i.* (as Marian's, with encoder_attn)
    model.decoder.layer_norm                  decoder.norm

Whisper's key projections have no bias. attnlab's have one, which changes no attention weight: a key's
bias adds q . b to every score of the query q, and the softmax over the keys does not see a constant. The
import gives them zeros, and the export leaves them out.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.errors import CheckpointError
from attnlab.interop.marian_weights import layer_pairs
from attnlab.nn.positional import WhisperSinusoidalPositional

PLAIN = {
    "stem.conv1.weight": "model.encoder.conv1.weight",
    "stem.conv1.bias": "model.encoder.conv1.bias",
    "stem.conv2.weight": "model.encoder.conv2.weight",
    "stem.conv2.bias": "model.encoder.conv2.bias",
    "encoder.norm.weight": "model.encoder.layer_norm.weight",
    "encoder.norm.bias": "model.encoder.layer_norm.bias",
    "tgt_embed.tokens.weight": "model.decoder.embed_tokens.weight",
    "tgt_embed.positional.table.weight": "model.decoder.embed_positions.weight",
    "decoder.norm.weight": "model.decoder.layer_norm.weight",
    "decoder.norm.bias": "model.decoder.layer_norm.bias",
}
ENCODER_POSITIONS, OUTPUT = "model.encoder.embed_positions.weight", "proj_out.weight"


def whisper_pairs(encoder_layers: int, decoder_layers: int) -> dict[str, tuple[str, ...]]:
    """attnlab's tensor name -> the Whisper names it is made of (several: fused, in order)."""
    return (
        {ours: (theirs,) for ours, theirs in PLAIN.items()}
        | layer_pairs("encoder", encoder_layers, cross=False)
        | layer_pairs("decoder", decoder_layers, cross=True)
    )


def is_key_bias(name: str) -> bool:
    """A Whisper name that attnlab has and Whisper has not: a key projection's bias."""
    return name.endswith(("self_attn.k_proj.bias", "encoder_attn.k_proj.bias"))


def hf_tensors(state: dict[str, torch.Tensor], pairs: dict[str, tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """Whisper's tensors from attnlab's (``state``): each fused tensor cut into its parts, the keys'
    biases left out."""
    out = {}
    for ours, theirs in pairs.items():
        for name, part in zip(theirs, state[ours].chunk(len(theirs))):
            if not is_key_bias(name):
                out[name] = part
    return out


def check_encoder_positions(weights: dict[str, torch.Tensor], d_model: int, where: Path) -> None:
    """Whisper's encoder positions are fixed sinusoids, which attnlab computes: a folder whose table is
    other numbers (trained, or of another formula) is refused in one line."""
    table = weights.get(ENCODER_POSITIONS)
    if table is None:
        return  # transformers' WhisperModel rebuilds them; nothing to check
    expected = WhisperSinusoidalPositional(d_model).encode(torch.arange(table.shape[0]))  # (n, d_model)
    if table.shape != expected.shape or (table.float() - expected).abs().max().item() > 1e-4:
        raise CheckpointError(
            f"{where}: {ENCODER_POSITIONS} is not Whisper's sinusoids (attnlab's encoder positions are fixed)"
        )


def tied_output(weights: dict[str, torch.Tensor], where: Path) -> None:
    """proj_out is the token table, as attnlab's generator is (a file that saved both must agree)."""
    tokens = weights.get(PLAIN["tgt_embed.tokens.weight"])
    if OUTPUT in weights and tokens is not None and not torch.equal(weights[OUTPUT], tokens):
        raise CheckpointError(f"{where}: {OUTPUT} differs from the token table; attnlab's Whisper ties them")


def whisper_tensors(
    weights: dict[str, torch.Tensor], pairs: dict[str, tuple[str, ...]], d_model: int, where: Path
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors from a WhisperForConditionalGeneration / WhisperModel state dict (the keys'
    missing biases as zeros), and the names of the original that have no place here. A missing tensor
    is refused in one line naming it (a shape unlike the model's: by runs/init.py's copy)."""
    check_encoder_positions(weights, d_model, where)
    tied_output(weights, where)
    plain = {name: t.float() for name, t in weights.items()}
    out, used = {}, {ENCODER_POSITIONS, OUTPUT}
    for ours, theirs in pairs.items():
        for name in theirs:
            if name not in plain and is_key_bias(name):
                plain[name] = torch.zeros(d_model)
            elif name not in plain:
                raise CheckpointError(f"{where}: no tensor {name}, which config.json's Whisper has")
        out[ours] = torch.cat([plain[name] for name in theirs])
        used |= set(theirs)
    return out, [name for name in weights if name not in used]
