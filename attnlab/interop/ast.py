"""Hugging Face AST folders (``model_type: audio-spectrogram-transformer``: ASTForAudioClassification) as
attnlab's ``ast`` runs and back (`attnlab import-hf DIR --out RUN`, `attnlab export-hf RUN --out DIR`).

The AST is attnlab's ``ast`` family with these settings: Kaldi's log fbank (``features.filterbank:
kaldi``, 25 ms windows every 10 ms at 16 kHz: the extractor's 400 and 160 samples) standardised by the
extractor's mean and twice its std (``features.offset``, ``features.scale``); the encoder reading the
whole window of ``max_length`` frames (``reads: window``: the extractor pads a short clip's log fbank
with zeros, and the model reads every patch); P x P patches one every ``hop`` frames and bands
(``frequency_stride`` = ``time_stride``: overlapping), learned positions over the patch sequence;
DeiT's class and distillation tokens, the mean of whose final states the head reads (``classifier.pooling:
distilled``) through a LayerNorm and a linear map (``classifier.head: normed``); pre-norm layers with
exact GELU. interop/ast_weights.py names the weights both ways; as for ViT, the tokens hold their
positions.

The import reads config.json, model.safetensors and, if present, preprocessor_config.json (the
ASTFeatureExtractor's rate, bands, max_length, mean and std); it makes an ``audio_classification`` run of
the folder's classes (id2label), whose clips are ``max_length`` frames long: `predict` and `evaluate`
read audio at the extractor's rate. SpecAugment is off. Options attnlab cannot represent are refused in
one line naming them all; so is every option of a run the AST has no counterpart for, on export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError
from attnlab.interop.ast_weights import ast_tensors, hf_tensors
from attnlab.interop.folder import (
    HIDDEN_ACTS,
    Exported,
    HFConverter,
    Imported,
    checked_config,
    read_json,
    read_weights,
    register_converter,
    unlike,
)
from attnlab.interop.vit import labels_of
from attnlab.models import FamilyConfig, build_model
from attnlab.models.shape import DataShape
from attnlab.models.spectrogram_transformer import ASTConfig
from attnlab.runs.init import InitReport, copy_tensors, named_tensors
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import TaskConfig, task_config

PREPROCESSOR = "preprocessor_config.json"
WINDOW, HOP = 400, 160  # ASTFeatureExtractor's frame_length and hop_length, in samples, at any rate
EXTRACTOR = {"sampling_rate": 16_000, "num_mel_bins": 128, "max_length": 1024, "mean": -4.2677393, "std": 4.5689974}
HEAD_EPS = 1e-12  # the LayerNorm of attnlab's normed head (the AST's default layer_norm_eps)
ACTIVATIONS = {theirs: ours for ours, theirs in HIDDEN_ACTS.items()}  # the AST's hidden_act -> attnlab's


def extractor_of(folder: Path) -> dict[str, Any]:
    """preprocessor_config.json's feature extraction (ASTFeatureExtractor's defaults for what it does
    not say), its standardisation as attnlab's offset and scale."""
    path = folder / PREPROCESSOR
    spec = EXTRACTOR | {"do_normalize": True} | (read_json(path) if path.is_file() else {})
    bad = [
        name
        for name in ("sampling_rate", "num_mel_bins", "max_length")
        if not (isinstance(spec[name], int) and spec[name] > 0)
    ]
    if bad or not (isinstance(spec["std"], (int, float)) and spec["std"] > 0):
        raise CheckpointError(f"{path}: {', '.join(bad) or 'std'} is not a positive number")
    return spec


def ast_model_fields(
    config: dict[str, Any], extractor: dict[str, Any], where: Path
) -> tuple[dict[str, Any], DataShape]:
    """attnlab's ast model section for an AST config.json and its feature extractor, and the data's sizes."""
    refused = []
    if config.get("frequency_stride", 10) != config.get("time_stride", 10):
        refused.append(
            f"frequency_stride {config.get('frequency_stride', 10)} unlike time_stride {config.get('time_stride', 10)} "
            f"(attnlab's patches have one hop)"
        )
    if not config.get("qkv_bias", True):
        refused.append("qkv_bias false (attnlab's query, key and value projections have biases)")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        refused.append(f"hidden_act {config['hidden_act']!r} (have {', '.join(ACTIVATIONS)})")
    if config.get("layer_norm_eps", HEAD_EPS) != HEAD_EPS:
        refused.append(f"layer_norm_eps {config['layer_norm_eps']} (attnlab's normed head has {HEAD_EPS})")
    for ours, theirs in (("num_mel_bins", "num_mel_bins"), ("max_length", "max_length")):
        if config.get(theirs, EXTRACTOR[ours]) != extractor[ours]:
            refused.append(f"{theirs} {config.get(theirs, EXTRACTOR[ours])} unlike the extractor's {extractor[ours]}")
    if refused:
        raise CheckpointError(f"{where}: {'; '.join(refused)}: not representable in attnlab's ast")
    rate, normalise = extractor["sampling_rate"], extractor["do_normalize"]
    try:
        return {
            "arch": "ast",
            "features": {
                "n_mels": extractor["num_mel_bins"],
                "window_ms": WINDOW * 1000 / rate,
                "hop_ms": HOP * 1000 / rate,
                "filterbank": "kaldi",
                "scaling": "log",
                "offset": extractor["mean"] if normalise else 0.0,
                "scale": 2 * extractor["std"] if normalise else 1.0,
            },
            "augment": {"freq_masks": 0, "time_masks": 0},
            "reads": "window",
            "patches": {
                "size": config.get("patch_size", 16),
                "hop": config.get("time_stride", 10),
                "positional": "learned",
            },
            "classifier": {"pooling": "distilled", "head": "normed"},
            "stack": {
                "d_model": config["hidden_size"],
                "n_heads": config["num_attention_heads"],
                "n_layers": config["num_hidden_layers"],
                "d_ff": config["intermediate_size"],
                "dropout": config.get("hidden_dropout_prob", 0.0),
                "attention_dropout": config.get("attention_probs_dropout_prob", 0.0),
                "activation": ACTIVATIONS[config.get("hidden_act", "gelu")],
                "norm": "pre",
                "layer_norm_eps": HEAD_EPS,
                "attention_backend": "sdpa",
            },
        }, DataShape(
            sample_rate=rate,
            samples=(extractor["max_length"] - 1) * HOP + WINDOW,  # max_length whole frames
            n_classes=len(labels_of(config, where)),
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which an AST config.json has") from None


def export_refusals(cfg: ASTConfig, run: RunDir | None) -> list[str]:
    """The run's options that the AST has no counterpart for, each 'field value (the AST's)'."""
    needs = {
        "features.filterbank": "kaldi",
        "features.scaling": "log",
        "patches.positional": "learned",
        "classifier.pooling": "distilled",
        "classifier.head": "normed",
        "stack.norm": "pre",
        "stack.normalisation": "layer",
        "stack.residual": True,
        "stack.ffn": True,
        "stack.attention_scale": "sqrt_dk",
        "stack.layer_norm_eps": HEAD_EPS,
    }
    refused = unlike(cfg, needs, "the AST's")
    if cfg.reading.reads != "window":  # written model.reads: the part is flattened
        refused.insert(0, f"reads {cfg.reading.reads!r} (the AST's is 'window')")
    if cfg.stack.activation not in HIDDEN_ACTS:
        refused.append(f"activation {cfg.stack.activation!r} (the AST has {', '.join(map(repr, HIDDEN_ACTS))})")
    if run is None:
        return refused
    if run.read_pruned_heads():
        refused.append("pruned heads (the AST has the same heads in every layer)")
    rate = run.read_shape().need("sample_rate", "an AST export")
    if (cfg.features.window(rate), cfg.features.hop(rate)) != (WINDOW, HOP):
        refused.append(
            f"features of {cfg.features.window(rate)} samples every {cfg.features.hop(rate)} at {rate:,} Hz "
            f"(the extractor's are {WINDOW} every {HOP})"
        )
    return refused


def export_ast(model: nn.Module, cfg: ASTConfig, run: RunDir) -> Exported:
    """ASTForAudioClassification and its ASTFeatureExtractor, of a run that passed :func:`export_refusals`."""
    shape = run.read_shape()
    rate, frames = shape.need("sample_rate", "an AST export"), cfg.features.frames(shape)
    state = {name: t.float() for name, t in model.state_dict().items()}
    labels = dict(enumerate(run.read_task_state()["labels"]))
    config = {
        "model_type": "audio-spectrogram-transformer",
        "architectures": ["ASTForAudioClassification"],
        "hidden_size": cfg.stack.d_model,
        "num_hidden_layers": cfg.stack.n_layers,
        "num_attention_heads": cfg.stack.n_heads,
        "intermediate_size": cfg.stack.d_ff,
        "hidden_act": HIDDEN_ACTS[cfg.stack.activation],
        "hidden_dropout_prob": cfg.stack.dropout,
        "attention_probs_dropout_prob": cfg.stack.attn_dropout,
        "layer_norm_eps": cfg.stack.layer_norm_eps,
        "patch_size": cfg.patches.size,
        "frequency_stride": cfg.patches.step,
        "time_stride": cfg.patches.step,
        "max_length": frames,
        "num_mel_bins": cfg.features.n_mels,
        "qkv_bias": True,
        "id2label": {str(i): name for i, name in labels.items()},
        "label2id": {name: i for i, name in labels.items()},
        "torch_dtype": "float32",
    }
    extractor = {
        "feature_extractor_type": "ASTFeatureExtractor",
        "feature_size": 1,
        "sampling_rate": rate,
        "num_mel_bins": cfg.features.n_mels,
        "max_length": frames,
        "padding_value": 0.0,
        "do_normalize": True,
        "mean": cfg.features.offset,
        "std": cfg.features.scale / 2,
        "return_attention_mask": False,
    }
    tensors = hf_tensors(state, cfg.stack.n_layers, cfg.patches.size)
    return Exported(config, tensors, {PREPROCESSOR: json.dumps(extractor, indent=2) + "\n"})


@register_converter
class ASTConverter(HFConverter):
    """ASTForAudioClassification <-> ast (an audio_classification run: predict, evaluate, inspect)."""

    model_type = "audio-spectrogram-transformer"
    arch = "ast"
    described = "AST"
    tokenizer_files = ((),)  # sound: no tokenizer

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        where = folder / "config.json"
        extractor = extractor_of(folder)
        fields, shape = ast_model_fields(config, extractor, where)
        cfg = checked_config(fields, shape, where, ASTConfig)
        model = build_model(cfg, shape)
        tensors, unused = ast_tensors(read_weights(folder), cfg.stack.n_layers)
        target = named_tensors(model)
        loaded = copy_tensors(target, tensors, str(folder / "model.safetensors"))
        new = [name for name in target if name not in tensors]
        rate = shape.need("sample_rate")
        data = task_config(
            {"task": "audio_classification", "sample_rate": rate, "clip_seconds": shape.need("samples") / rate}
        )
        report = InitReport(str(folder), loaded, new, unused, untrained=new)  # what the folder lacks stays random
        return Imported(model, cfg, shape, data, None, report, task_state={"labels": labels_of(config, where)})

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, ASTConfig)  # refusal asks it of ast runs alone
        return export_refusals(cfg, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, ASTConfig)  # export_hf's converter of arch ast
        return export_ast(model, cfg, run)
