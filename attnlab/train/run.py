"""A training run from a config: prepare the data, build the model, fit, and write the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.config import ModelConfig, RunConfig
from attnlab.data.datasets import LMData, Seq2SeqData, prepare_data
from attnlab.data.tokenizers import PAD
from attnlab.errors import ConfigError
from attnlab.files import atomic_write_text
from attnlab.nn.transformer import LayerStack
from attnlab.train.checkpoint import RunDir
from attnlab.train.distributed import World
from attnlab.train.loop import fit


def _model_config(cfg: RunConfig, data: Seq2SeqData | LMData) -> ModelConfig:
    """The model section completed with the tokenizers' vocabulary sizes and PAD id."""
    src, tgt = data.tokenizers["src"], data.tokenizers["tgt"]
    separate = src is not None and not cfg.data.shared_vocab
    return cfg.model_config(tgt.vocab_size, src.vocab_size if separate else None, PAD)


def describe_data(data: Seq2SeqData | LMData) -> str:
    if isinstance(data, LMData):
        sizes = ", ".join(f"{name} {len(s):,} tokens" for name, s in data.streams.items())
        return f"language-model text: {sizes}; vocabulary {data.tokenizers['tgt'].vocab_size}"
    sizes = ", ".join(f"{name} {len(e):,}" for name, e in data.splits.items())
    src, tgt = data.tokenizers["src"], data.tokenizers["tgt"]
    vocab = f"shared vocabulary {tgt.vocab_size}" if src is tgt else f"vocabularies {src.vocab_size} / {tgt.vocab_size}"
    report = f"; train filter: {data.reports['train']}" if "train" in data.reports else ""
    return f"pairs: {sizes}; {vocab}{report}"


def train_run(cfg: RunConfig, out: str | Path, resume: bool = False,
              log: Callable[[str], None] = print, world: World | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says into the run directory ``out`` (or continue it with ``resume``) and
    return the summary written to ``out/summary.json``. With ``world`` (torchrun), every rank
    calls this; rank 0 alone writes and logs."""
    main = world is None or world.is_main
    log = log if main else (lambda line: None)
    run = RunDir(out)
    if resume:
        for stale in (run.remove_partial_checkpoints() if main else []):
            log(f"removed {stale.name}, a checkpoint that an interrupted run left half-written")
        if world:
            world.barrier()
        if not run.steps():
            run.read_config()  # it must be a run directory, if one killed before its first checkpoint
            log(f"{run.path}: no complete checkpoint yet; starting from step 0")
            resume = False
    if resume:
        model_cfg, data_cfg, _ = run.read_config()
        if data_cfg != cfg.data:
            raise ConfigError(f"{run.config}: the data section differs from the given config; a resumed run keeps its data")
        data = prepare_data(data_cfg, cfg.train.max_tokens, cfg.train.batch_size, cfg.train.seed, run.read_tokenizers())
        if _model_config(cfg, data) != model_cfg:
            raise ConfigError(f"{run.config}: the model section differs from the given config; a resumed run keeps its model")
        run.load_trainer_state(run.steps()[-1])  # refuse a damaged state before touching config.yaml
    else:
        data = prepare_data(cfg.data, cfg.train.max_tokens, cfg.train.batch_size, cfg.train.seed)
        model_cfg = _model_config(cfg, data)
    # config.yaml first: it marks the directory as a run, so that a run killed before its first
    # checkpoint can be resumed (from step 0) rather than refused as someone else's directory
    if main:
        run.write_config(model_cfg, cfg.data, cfg.train)
        if not resume:
            run.write_tokenizers(data.tokenizers)
    log(describe_data(data))
    torch.manual_seed(cfg.train.seed)
    model = run.build_model(model_cfg)
    for module in model.modules():
        if isinstance(module, LayerStack):
            module.checkpoint_activations = cfg.train.activation_checkpointing
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {model_cfg.arch}, {n_params:,} parameters; run directory {run.path}")
    summary = fit(model, data, cfg.train, run, model_cfg.d_model, resume=resume, log=log, world=world)
    summary = {"run_dir": str(run.path), "arch": model_cfg.arch, "n_params": n_params, **summary}
    if main:
        atomic_write_text(run.summary, json.dumps(summary, indent=2))
    return summary
