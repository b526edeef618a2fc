"""Hugging Face Whisper folders (``model_type: whisper``: WhisperForConditionalGeneration) as attnlab's
``whisper`` runs and back (`attnlab import-hf DIR --out RUN`, `attnlab export-hf RUN --out DIR`).

Whisper is attnlab's ``whisper`` family with these settings: the encoder ``reads: window`` (every clip
padded with silence to the feature extractor's chunk, and every frame read: Whisper's encoder has no
mask), log-mels ``scaling: whisper`` at 16 kHz (WhisperFeatureExtractor's mel bands stop at 8 kHz, half
of 16 kHz, as attnlab's stop at half the rate), pre-norm stacks with LayerNorm's eps 1e-5, the decoder's
learned positions added to unscaled token vectors (``embeddings.kind: plain``: transformers' Whisper
never multiplies by sqrt(d), whatever config.json's ``scale_embedding`` says) and its output tied to the
token table. interop/whisper_weights.py names the weights both ways; the keys' biases, which Whisper
lacks, change no attention weight.

The import reads config.json, model.safetensors, tokenizer.json and, if present,
preprocessor_config.json (WhisperFeatureExtractor's sampling_rate, n_fft, hop_length, feature_size and
chunk_length; without it, its defaults). It makes a ``speech_recognition`` run: `attnlab transcribe`
and `evaluate` read audio at the extractor's rate, at most chunk_length seconds of it. SpecAugment is
off (Whisper trains without it; a fine-tuning run may turn ``model.augment`` on). The tokenizer must
number attnlab's control tokens as attnlab does (<pad> 0, <bos> 1 = the decoder's start, <eos> 2,
<unk> 3): an export of attnlab's. OpenAI's released checkpoints (<|endoftext|> as both pad and end, the
decoder started by <|startoftranscript|> and a language and task prompt) are refused in one line.

The export writes those settings back, with the feature extractor of the run's features and window and a
tokenizer.json of the run's tokens at their ids; options Whisper has no counterpart for are refused in
one line naming them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.tokenizers import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Tokenizer
from attnlab.errors import CheckpointError
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
from attnlab.interop.gpt2_vocabulary import keeps_attnlab_controls, library_tokenizer, token_ids
from attnlab.interop.whisper_weights import ENCODER_POSITIONS, hf_tensors, whisper_pairs, whisper_tensors
from attnlab.models import FamilyConfig, build_model
from attnlab.models.shape import DataShape
from attnlab.models.whisper import WhisperConfig
from attnlab.nn.positional import WhisperSinusoidalPositional
from attnlab.nn.registry import ATTENTION_BACKENDS
from attnlab.runs.init import InitReport, copy_tensors, named_tensors
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import TaskConfig, task_config

PREPROCESSOR, TOKENIZER = "preprocessor_config.json", "tokenizer.json"
RATE = 16_000  # the only rate at which WhisperFeatureExtractor's bands (0 - 8 kHz) reach half the rate, as attnlab's
EXTRACTOR = {"feature_size": 80, "sampling_rate": RATE, "hop_length": 160, "n_fft": 400, "chunk_length": 30}
ACTIVATIONS = {theirs: ours for ours, theirs in HIDDEN_ACTS.items()}  # Whisper's activation_function -> attnlab's
LAYER_NORM_EPS = 1e-5  # transformers' Whisper: nn.LayerNorm's default


def extractor_of(folder: Path) -> dict[str, Any]:
    """preprocessor_config.json's feature extraction (WhisperFeatureExtractor's defaults for what it
    does not say), refused in one line where attnlab's log-mels would differ."""
    path = folder / PREPROCESSOR
    spec = EXTRACTOR | (read_json(path) if path.is_file() else {})
    refused = []
    if spec["sampling_rate"] != RATE:
        refused.append(f"sampling_rate {spec['sampling_rate']} (the extractor's mel bands stop at 8 kHz: at {RATE})")
    if spec.get("dither", 0.0):
        refused.append(f"dither {spec['dither']} (attnlab adds no noise to its features)")
    bad = [name for name in EXTRACTOR if not (isinstance(spec[name], int) and spec[name] > 0)]
    refused += [f"{name} {spec[name]!r} (a positive whole number)" for name in bad]
    if refused:
        raise CheckpointError(f"{path}: {'; '.join(refused)}: not attnlab's log-mels")
    return spec


def whisper_model_fields(
    config: dict[str, Any], extractor: dict[str, Any], where: Path
) -> tuple[dict[str, Any], DataShape]:
    """attnlab's whisper model section for a Whisper config.json and its feature extractor, and the
    data's sizes. Options attnlab cannot represent are refused in one line naming them."""
    must = {"tie_word_embeddings": True, "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0}
    refused = [f"{name} {config[name]!r}" for name, fine in must.items() if name in config and config[name] != fine]
    for ours, (a, b) in {
        "n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
        "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
    }.items():
        if config.get(a) != config.get(b):
            refused.append(f"{a} {config.get(a)} unlike {b} {config.get(b)} (attnlab has one {ours})")
    if config.get("activation_function", "gelu") not in ACTIVATIONS:
        refused.append(f"activation_function {config['activation_function']!r} (have {', '.join(ACTIVATIONS)})")
    frames = extractor["chunk_length"] * extractor["sampling_rate"] // extractor["hop_length"]
    if config.get("max_source_positions", 1500) * 2 != frames:
        refused.append(
            f"max_source_positions {config.get('max_source_positions', 1500)} (the encoder reads half the "
            f"{frames} frames of the feature extractor's {extractor['chunk_length']} s chunk)"
        )
    if config.get("num_mel_bins", 80) != extractor["feature_size"]:
        refused.append(
            f"num_mel_bins {config.get('num_mel_bins', 80)} unlike the extractor's {extractor['feature_size']}"
        )
    if refused:
        raise CheckpointError(f"{where}: {'; '.join(refused)}: not representable in attnlab's whisper")
    rate = extractor["sampling_rate"]
    try:
        return {
            "arch": "whisper",
            "features": {
                "n_mels": extractor["feature_size"],
                "window_ms": extractor["n_fft"] * 1000 / rate,
                "hop_ms": extractor["hop_length"] * 1000 / rate,
                "scaling": "whisper",
            },
            "augment": {"freq_masks": 0, "time_masks": 0},
            "reads": "window",
            "stack": {
                "d_model": config["d_model"],
                "n_heads": config["encoder_attention_heads"],
                "n_layers": config["encoder_layers"],
                "d_ff": config["encoder_ffn_dim"],
                "dropout": config.get("dropout", 0.0),
                "attention_dropout": config.get("attention_dropout", 0.0),
                "activation": ACTIVATIONS[config.get("activation_function", "gelu")],
                "norm": "pre",
                "layer_norm_eps": LAYER_NORM_EPS,
                "attention_backend": "sdpa",
            },
            "positions": {"scheme": "learned", "max_len": config["max_target_positions"]},
            "embeddings": {"kind": "plain", "tie": "output"},
            "depths": {"encoder": config["encoder_layers"], "decoder": config["decoder_layers"]},
        }, DataShape(
            vocab_size=config["vocab_size"],
            pad_id=PAD,
            sample_rate=rate,
            samples=extractor["chunk_length"] * rate,
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which a Whisper config.json has") from None


def whisper_tokenizer(folder: Path, config: dict[str, Any]) -> Tokenizer:
    """tokenizer.json, which must number attnlab's control tokens as attnlab does, as config.json's
    ids do, and start the decoder at <bos>."""
    where = folder / TOKENIZER
    spec = read_json(where)
    model = spec.get("model") or {}
    if not isinstance(model.get("vocab"), (dict, list)):
        raise CheckpointError(f"{where}: no model vocabulary, which a tokenizer.json has")
    vocab = token_ids(model) | {entry["content"]: entry["id"] for entry in spec.get("added_tokens", [])}
    if len(vocab) != config.get("vocab_size"):
        raise CheckpointError(f"{where}: {len(vocab)} tokens, config.json's vocab_size is {config.get('vocab_size')}")
    if not keeps_attnlab_controls(vocab, config) or config.get("decoder_start_token_id", BOS) != BOS:
        raise CheckpointError(
            f"{where}: attnlab imports Whisper folders that number {' '.join(SPECIAL_TOKENS)} 0-3, as config.json's "
            f"pad, bos and eos ids, and start the decoder at <bos> (attnlab's exports); OpenAI's own vocabulary "
            f"and prompt are not read"
        )
    return library_tokenizer(spec, where)


def export_refusals(cfg: WhisperConfig, run: RunDir | None) -> list[str]:
    """The run's options that Whisper has no counterpart for, each 'field value (Whisper's)'."""
    needs = {
        "features.scaling": "whisper",
        "positions.scheme": "learned",
        "positions.combine": "add",
        "embeddings.kind": "plain",
        "embeddings.vocab_multiple": 1,
        "stack.norm": "pre",
        "stack.normalisation": "layer",
        "stack.residual": True,
        "stack.ffn": True,
        "stack.attention_scale": "sqrt_dk",
        "stack.layer_norm_eps": LAYER_NORM_EPS,
    }
    refused = unlike(cfg, needs, "Whisper's")
    if cfg.reading.reads != "window":  # written model.reads: the part is flattened
        refused.insert(0, f"reads {cfg.reading.reads!r} (Whisper's is 'window')")
    if "output" not in cfg.embeddings.tied(("output",)):
        refused.append(f"embeddings.tie {cfg.embeddings.tie!r} (Whisper's output is its token table)")
    if cfg.stack.activation not in HIDDEN_ACTS:
        refused.append(f"activation {cfg.stack.activation!r} (Whisper has {', '.join(map(repr, HIDDEN_ACTS))})")
    if not ATTENTION_BACKENDS[cfg.stack.attention_backend].exact:
        refused.append(f"attention_backend {cfg.stack.attention_backend!r} (Whisper attends to every token)")
    if run is None:
        return refused
    if run.read_pruned_heads():
        refused.append("pruned heads (Whisper has the same heads in every layer)")
    shape = run.read_shape()
    rate, samples = shape.need("sample_rate", "a Whisper export"), shape.need("samples", "a Whisper export")
    if rate != RATE:
        refused.append(f"sample_rate {rate} (WhisperFeatureExtractor's mel bands reach half the rate at {RATE} only)")
    if samples % rate:
        refused.append(f"a window of {samples / rate:g} s (WhisperFeatureExtractor's chunk_length is whole seconds)")
    elif cfg.features.window(rate) != cfg.features.window_ms * rate / 1000 or (
        cfg.features.hop(rate) != cfg.features.hop_ms * rate / 1000
    ):
        refused.append("features.window_ms or hop_ms not a whole number of samples (the extractor counts samples)")
    elif cfg.features.frames(shape) % 2:
        refused.append(f"a window of {cfg.features.frames(shape)} frames (Whisper's encoder reads an even number)")
    return refused


def export_whisper(model: nn.Module, cfg: WhisperConfig, tokenizer: Tokenizer, run: RunDir) -> Exported:
    """WhisperForConditionalGeneration, its WhisperFeatureExtractor and tokenizer, of a run that passed
    :func:`export_refusals`."""
    shape = run.read_shape()
    rate, samples, vocab_size = shape.need("sample_rate"), shape.need("samples"), shape.need("vocab_size")
    d_model, frames = cfg.stack.d_model, cfg.features.frames(shape)
    state = {name: t.float() for name, t in model.state_dict().items()}
    tensors = hf_tensors(state, whisper_pairs(cfg.encoder_layers, cfg.decoder_layers))
    tensors[ENCODER_POSITIONS] = WhisperSinusoidalPositional(d_model).encode(torch.arange(frames // 2))  # fixed
    controls = {"pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS, "decoder_start_token_id": BOS}
    config = {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab_size,
        "num_mel_bins": cfg.features.n_mels,
        "d_model": d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.stack.n_heads,
        "decoder_attention_heads": cfg.stack.n_heads,
        "encoder_ffn_dim": cfg.stack.d_ff,
        "decoder_ffn_dim": cfg.stack.d_ff,
        "max_source_positions": frames // 2,
        "max_target_positions": cfg.positions.max_len,
        "activation_function": HIDDEN_ACTS[cfg.stack.activation],
        "dropout": cfg.stack.dropout,
        "attention_dropout": cfg.stack.attn_dropout,
        "activation_dropout": 0.0,
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "apply_spec_augment": False,
        "torch_dtype": "float32",
    } | controls
    generation = controls | {"max_length": cfg.positions.max_len, "suppress_tokens": [], "begin_suppress_tokens": []}
    extractor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": cfg.features.n_mels,
        "sampling_rate": rate,
        "n_fft": cfg.features.window(rate),
        "hop_length": cfg.features.hop(rate),
        "chunk_length": samples // rate,
        "padding_value": 0.0,
        "padding_side": "right",
        "return_attention_mask": False,
        "dither": 0.0,
    }
    names = {role: SPECIAL_TOKENS[i] for role, i in (("pad_token", PAD), ("bos_token", BOS), ("eos_token", EOS))}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIAL_TOKENS[UNK]} | names
    files = {
        TOKENIZER: tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n",
        PREPROCESSOR: json.dumps(extractor, indent=2) + "\n",
        "generation_config.json": json.dumps(generation, indent=2) + "\n",
    }
    return Exported(config, tensors, files)


@register_converter
class WhisperConverter(HFConverter):
    """WhisperForConditionalGeneration <-> whisper (a speech_recognition run: transcribe, evaluate, inspect)."""

    model_type = "whisper"
    arch = "whisper"
    described = "Whisper"

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        where = folder / "config.json"
        extractor = extractor_of(folder)
        fields, shape = whisper_model_fields(config, extractor, where)
        tokenizer = whisper_tokenizer(folder, config)
        cfg = checked_config(fields, shape, where, WhisperConfig)
        model = build_model(cfg, shape)
        pairs = whisper_pairs(cfg.encoder_layers, cfg.decoder_layers)
        tensors, unused = whisper_tensors(read_weights(folder), pairs, cfg.stack.d_model, folder / "model.safetensors")
        target = named_tensors(model)
        loaded = copy_tensors(target, tensors, str(folder / "model.safetensors"))
        data = task_config(
            {
                "task": "speech_recognition",
                "sample_rate": shape.sample_rate,
                "strings": {"longest_seconds": extractor["chunk_length"]},
            }
        )
        report = InitReport(str(folder), loaded, [name for name in target if name not in tensors], unused, untrained=[])
        return Imported(model, cfg, shape, data, tokenizer, report)

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, WhisperConfig)  # refusal asks it of whisper runs alone
        return export_refusals(cfg, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, WhisperConfig)  # export_hf's converter of arch whisper
        return export_whisper(model, cfg, tokenizers["tgt"], run)
