"""GPT-2 (``model_type: gpt2``: GPT2LMHeadModel, GPT2Model) <-> attnlab's ``decoder_lm`` family.

GPT-2 is attnlab's decoder-only LM with ``embeddings.kind: plain`` (E[w] + P[pos], no sqrt(d) scale),
learned positions, pre-norm layers and the final LayerNorm that pre-norm stacks end with, GELU's
tanh approximation (``gelu_tanh``, GPT-2's ``gelu_new``), and the output projection tied to the
token embedding. Its Conv1D layers store their weight as (in, out), the transpose of a Linear's,
and its fused query-key-value projection is attnlab's ``qkv_proj`` in the same (q, k, v) x heads
layout, so the weights map one to one, transposed:

    wte                      embed.tokens (rows renumbered, below)
    wpe                      embed.positional.table
    h.i.ln_1                 decoder.layers.i.self_attn_residual.norm
    h.i.attn.c_attn          decoder.layers.i.self_attn.qkv_proj    (transposed)
    h.i.attn.c_proj          decoder.layers.i.self_attn.out_proj    (transposed)
    h.i.ln_2                 decoder.layers.i.feed_forward_residual.norm
    h.i.mlp.c_fc             decoder.layers.i.feed_forward.w_1      (transposed)
    h.i.mlp.c_proj           decoder.layers.i.feed_forward.w_2      (transposed)
    ln_f                     decoder.norm
    lm_head                  generator (tied: the embedding again)

The vocabulary (GPT-2's end of text as <eos>, the control tokens added, the ids an export puts back)
and the tokenizer files are interop/gpt2_vocabulary.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.errors import CheckpointError
from attnlab.interop.folder import (
    Exported,
    HFConverter,
    Imported,
    checked_config,
    read_weights,
    register_converter,
    renumbered_spec,
    unlike,
)
from attnlab.interop.gpt2_vocabulary import ADDED, exported_vocabulary, renumbered_tokenizer
from attnlab.models import FamilyConfig, build_model
from attnlab.models.decoder_lm import DecoderLMConfig
from attnlab.models.shape import DataShape
from attnlab.nn.registry import ATTENTION_BACKENDS
from attnlab.runs.init import InitReport, copy_tensors, named_tensors
from attnlab.runs.run_dir import RunDir
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks import TaskConfig, task_config

ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}  # GPT-2's activation_function -> attnlab's activation
EXPORTED_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # stored (in, out): transposed


def gpt2_model_fields(
    config: dict[str, Any], where: Path | str, output_vocabulary: str = "text"
) -> tuple[dict[str, Any], DataShape]:
    """attnlab's decoder_lm model section for a GPT-2 config.json, and the data's sizes (vocab_size:
    GPT-2's, plus the three added control tokens where ``output_vocabulary`` is ``text``). Options
    attnlab cannot represent are refused in one line naming them."""
    unsupported = [
        f"{name} {config[name]!r}"
        for name, fine in (
            ("scale_attn_by_inverse_layer_idx", False),
            ("add_cross_attention", False),
            ("tie_word_embeddings", True),
        )
        if name in config and config[name] != fine
    ]
    if config.get("activation_function", "gelu_new") not in ACTIVATIONS:
        unsupported.append(f"activation_function {config['activation_function']!r} (have {', '.join(ACTIVATIONS)})")
    if config.get("embd_pdrop", 0.1) != config.get("resid_pdrop", 0.1):
        unsupported.append(
            f"embd_pdrop {config['embd_pdrop']} unlike resid_pdrop {config.get('resid_pdrop', 0.1)} "
            f"(attnlab has one dropout)"
        )
    if unsupported:
        raise CheckpointError(f"{where}: {'; '.join(unsupported)}: not representable in attnlab's decoder_lm")
    try:
        d = config["n_embd"]
        stack = {
            "d_model": d,
            "n_heads": config["n_head"],
            "n_layers": config["n_layer"],
            "d_ff": config.get("n_inner") or 4 * d,
            "dropout": config.get("resid_pdrop", 0.1),
            "attention_dropout": config.get("attn_pdrop", 0.1),
            "activation": ACTIVATIONS[config.get("activation_function", "gelu_new")],
            "norm": "pre",
            "layer_norm_eps": config.get("layer_norm_epsilon", 1e-5),
            "attention_backend": "sdpa",
            "attention_scale": "sqrt_dk" if config.get("scale_attn_weights", True) else "none",
        }
        added = len(ADDED) if output_vocabulary == "text" else 0
        return (
            {
                "arch": "decoder_lm",
                "stack": stack,
                "positions": {"scheme": "learned", "max_len": config["n_positions"]},
                "embeddings": {"kind": "plain", "tie": "output"},
                "output": {"vocabulary": output_vocabulary},
            },
            DataShape(vocab_size=config["vocab_size"] + added, pad_id=PAD),
        )
    except KeyError as err:
        raise CheckpointError(f"{where}: no {err.args[0]!r}, which a GPT-2 config.json has") from None


def gpt2_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape as config.json implies it (Conv1D weights (in, out))."""
    d, inner = config["n_embd"], config.get("n_inner") or 4 * config["n_embd"]
    shapes = {
        "wte.weight": (config["vocab_size"], d),
        "wpe.weight": (config["n_positions"], d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(config["n_layer"]):
        for norm in ("ln_1", "ln_2"):
            shapes |= {f"h.{i}.{norm}.weight": (d,), f"h.{i}.{norm}.bias": (d,)}
        for conv, (n_in, n_out) in zip(CONV1D, ((d, 3 * d), (d, d), (d, inner), (inner, d))):
            shapes |= {f"h.{i}.{conv}.weight": (n_in, n_out), f"h.{i}.{conv}.bias": (n_out,)}
    return shapes


def attnlab_name(name: str) -> str:
    """A GPT-2 tensor name (no ``transformer.`` prefix) -> attnlab's."""
    fixed = {
        "wte.weight": "embed.tokens.weight",
        "wpe.weight": "embed.positional.table.weight",
        "ln_f.weight": "decoder.norm.weight",
        "ln_f.bias": "decoder.norm.bias",
    }
    if name in fixed:
        return fixed[name]
    _, i, rest = name.split(".", 2)  # h.i.rest
    parts = {
        "ln_1": "self_attn_residual.norm",
        "ln_2": "feed_forward_residual.norm",
        "attn.c_attn": "self_attn.qkv_proj",
        "attn.c_proj": "self_attn.out_proj",
        "mlp.c_fc": "feed_forward.w_1",
        "mlp.c_proj": "feed_forward.w_2",
    }
    module, kind = rest.rsplit(".", 1)
    return f"decoder.layers.{i}.{parts[module]}.{kind}"


def gpt2_tensors(
    weights: dict[str, torch.Tensor], config: dict[str, Any], rows: list[int], where: Path | str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """attnlab's tensors from a GPT-2 state dict (GPT2LMHeadModel's ``transformer.`` prefix dropped),
    the token rows taken in ``rows``; and the names of the original that have no place here. Every
    shape is checked against config.json first, in one line."""
    plain = {name.removeprefix("transformer."): t for name, t in weights.items()}
    expected = gpt2_shapes(config)
    missing = [name for name in expected if name not in plain]
    if missing:
        raise CheckpointError(
            f"{where}: no tensor {missing[0]}{f' (nor {len(missing) - 1} more)' if len(missing) > 1 else ''}, "
            f"which config.json's GPT-2 has"
        )
    for name, shape in expected.items():
        if tuple(plain[name].shape) != shape:
            raise CheckpointError(f"{where}: {name} has shape {tuple(plain[name].shape)}; config.json gives {shape}")
    head = plain.get("lm_head.weight")
    if head is not None and not torch.equal(head, plain["wte.weight"]):
        raise CheckpointError(f"{where}: lm_head.weight differs from wte.weight; attnlab's GPT-2 ties them")
    out = {}
    for name in expected:
        tensor = plain[name].float()
        if name.endswith(".weight") and name.split(".", 2)[-1].rsplit(".", 1)[0] in CONV1D:
            tensor = tensor.t()  # Conv1D (in, out) -> Linear (out, in)
        out[attnlab_name(name)] = tensor
    out["embed.tokens.weight"] = out["embed.tokens.weight"][rows]
    buffers = (".attn.bias", ".attn.masked_bias")  # older saves' causal masks, not weights
    unused = [
        name for name in plain if name not in expected and name != "lm_head.weight" and not name.endswith(buffers)
    ]
    return out, unused


def export_refusals(cfg: DecoderLMConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
    """The run's options that GPT-2 has no counterpart for, each 'field value (GPT-2's)'."""
    needs = {
        "embeddings.kind": "plain",
        "positions.scheme": "learned",
        "positions.combine": "add",
        "stack.norm": "pre",
        "stack.normalisation": "layer",
        "stack.residual": True,
        "stack.ffn": True,
        "embeddings.tie": "output",
        "multi_token_heads": 0,
        "output.bias": False,
    }
    refused = unlike(cfg, needs, "GPT-2's")
    if cfg.stack.activation not in EXPORTED_ACTIVATIONS:
        refused.append(f"activation {cfg.stack.activation!r} (GPT-2 has {', '.join(map(repr, EXPORTED_ACTIVATIONS))})")
    if cfg.stack.attention_scale == "learned":
        refused.append("stack.attention_scale 'learned' (GPT-2 scales by 1 / sqrt(d_k) or not at all)")
    if not ATTENTION_BACKENDS[cfg.stack.attention_backend].exact:
        refused.append(f"attention_backend {cfg.stack.attention_backend!r} (GPT-2 attends to every earlier token)")
    if run is not None and run.read_pruned_heads():
        refused.append("pruned heads (GPT-2 has n_head in every layer)")
    return refused


@register_converter
class GPT2Converter(HFConverter):
    """GPT2LMHeadModel / GPT2Model <-> decoder_lm (a language-model run: generate, score, inspect,
    prune, serve)."""

    model_type = "gpt2"
    arch = "decoder_lm"
    described = "GPT-2"
    tokenizer_files = (("tokenizer.json",), ("vocab.json", "merges.txt"))

    @classmethod
    def import_folder(cls, folder: Path, config: dict[str, Any]) -> Imported:
        vocabulary = renumbered_tokenizer(folder, config)
        fields, shape = gpt2_model_fields(config, folder / "config.json", vocabulary.output_vocabulary)
        tokenizer, order, eos = vocabulary.tokenizer, vocabulary.order, vocabulary.end_of_text
        cfg = checked_config(fields, shape, folder / "config.json", DecoderLMConfig)
        rows = [
            config.get("eos_token_id", 50256) if old is None else old for old in order
        ]  # added: the end of text's row
        tensors, unused = gpt2_tensors(read_weights(folder), config, rows, folder / "model.safetensors")
        model = build_model(cfg, shape)
        target = named_tensors(model)
        loaded = copy_tensors(target, tensors, str(folder / "model.safetensors"))
        data = task_config(
            {
                "task": "language_model",
                "text": {"tokenizer": vocabulary.kind, "vocab_size": shape.vocab_size},
                "block_size": min(cfg.positions.max_len, 256),
            }
        )
        report = InitReport(str(folder), loaded, [name for name in target if name not in tensors], unused, untrained=[])
        return Imported(
            model,
            cfg,
            shape,
            data,
            tokenizer,
            report,
            {"order": order, "end_of_text": eos},
            TrainConfig(progress=False, label_smoothing=0.0),
        )

    @classmethod
    def export_refusals(cls, cfg: FamilyConfig, data: TaskConfig, run: RunDir | None) -> list[str]:
        assert isinstance(cfg, DecoderLMConfig)  # refusal and export-ct2 ask it of decoder_lm runs alone
        return export_refusals(cfg, data, run)

    @classmethod
    def export_run(cls, model: nn.Module, cfg: FamilyConfig, tokenizers: dict[str, Tokenizer], run: RunDir) -> Exported:
        assert isinstance(cfg, DecoderLMConfig)  # export_hf's converter of arch decoder_lm
        tokenizer, ids = tokenizers["tgt"], exported_vocabulary(cfg, run)
        init = run.read_init() if run.init.is_file() else {}
        eos = init.get("end_of_text", "<eos>") if cfg.output.vocabulary == "text" else "<eos>"
        state = {name: t.float() for name, t in model.state_dict().items()}
        tensors = {
            "wte.weight": state["embed.tokens.weight"][ids],
            "wpe.weight": state["embed.positional.table.weight"],
        }
        for name in gpt2_shapes(
            {
                "n_embd": cfg.stack.d_model,
                "n_inner": cfg.stack.d_ff,
                "vocab_size": len(ids),
                "n_positions": cfg.positions.max_len,
                "n_layer": cfg.stack.n_layers,
            }
        ):
            if name not in tensors:
                tensor = state[attnlab_name(name)]
                conv = name.endswith(".weight") and name.split(".", 2)[-1].rsplit(".", 1)[0] in CONV1D
                tensors[name] = tensor.t() if conv else tensor
        tensors = {f"transformer.{name}": t for name, t in tensors.items()}
        controls = {
            "all": {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD},
            "text": {"bos_token_id": ids.index(EOS), "eos_token_id": ids.index(EOS)},
        }[cfg.output.vocabulary]
        config = {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": len(ids),
            "n_positions": cfg.positions.max_len,
            "n_embd": cfg.stack.d_model,
            "n_layer": cfg.stack.n_layers,
            "n_head": cfg.stack.n_heads,
            "n_inner": cfg.stack.d_ff,
            "activation_function": EXPORTED_ACTIVATIONS[cfg.stack.activation],
            "resid_pdrop": cfg.stack.dropout,
            "embd_pdrop": cfg.stack.dropout,
            "attn_pdrop": cfg.stack.attn_dropout,
            "layer_norm_epsilon": cfg.stack.layer_norm_eps,
            "scale_attn_weights": cfg.stack.attention_scale == "sqrt_dk",
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
        } | controls
        names = (
            {"bos_token": eos, "eos_token": eos}
            if cfg.output.vocabulary == "text"
            else {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
        )
        byte_level = (json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}).get("type") == "ByteLevel"
        tokenizer_config = {
            "tokenizer_class": "GPT2TokenizerFast" if byte_level else "PreTrainedTokenizerFast",
            "model_max_length": cfg.positions.max_len,
            "add_prefix_space": False,
        } | names
        files = {
            "tokenizer.json": json.dumps(renumbered_spec(tokenizer, ids, {"<eos>": eos}), ensure_ascii=False),
            "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n",
        }
        return Exported(config, tensors, files)
