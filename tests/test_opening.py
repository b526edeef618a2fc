"""runs/opening.py: a run opened for training, new or resumed, as one object; the trainer's checks
and its changes to the model come before any file is written."""

from __future__ import annotations

import pytest
import torch
from test_train import run_config

from attnlab.errors import ConfigError
from attnlab.models.shape import DataShape
from attnlab.runs.opening import open_run
from attnlab.runs.run_dir import RunDir
from attnlab.train.run import train_run


def _open(cfg, out, resume=False, check=lambda model_cfg, data: None, adapt=lambda model: None, **kw):
    lines: list[str] = []
    opened = open_run(
        cfg, out, resume, kw.get("resume_from"), kw.get("allow_changes", False), True, lines.append, check, adapt
    )
    return opened, lines


def test_a_refused_check_or_adapt_writes_nothing(tmp_path):
    def refuse(*args):
        raise ConfigError("refused")

    for hook in ("check", "adapt"):
        out = tmp_path / hook
        with pytest.raises(ConfigError, match="refused"):
            _open(run_config(), out, **{hook: refuse})
        assert not out.exists() or not any(out.iterdir())


def test_a_new_run_is_written_whole_and_read_back_the_same(tmp_path):
    seen = {}
    opened, _ = _open(
        run_config(),
        tmp_path / "run",
        check=lambda model_cfg, data: seen.update(cfg=model_cfg),
        adapt=lambda model: seen.update(model=model),
    )
    assert opened.point is None and opened.changes == [] and seen["model"] is opened.model
    model_cfg, data_cfg, train_cfg = RunDir(tmp_path / "run").read_config()
    assert model_cfg == opened.model_cfg == seen["cfg"] and data_cfg == run_config().data
    assert train_cfg == run_config().train
    # the copy task's shared word vocabulary (36 words and 4 control tokens), as the tokenizer files
    # hold it, sizes the model's embeddings: one vocabulary for both sides, kept in shape.json
    tokenizers = RunDir(tmp_path / "run").read_tokenizers()
    assert {role: tok.vocab_size for role, tok in tokenizers.items()} == {"src": 40, "tgt": 40}
    assert opened.shape == RunDir(tmp_path / "run").read_shape() == DataShape(vocab_size=40)
    assert opened.model.src_embed.tokens.num_embeddings == opened.model.tgt_embed.tokens.num_embeddings == 40
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "config.yaml",
        "shape.json",
        "tokenizer-src.json",
        "tokenizer-tgt.json",
    ]
    assert opened.untrained == set()
    assert sum(p.numel() for p in opened.model.parameters()) > 0


def test_a_resume_reads_the_checkpoint_and_changes_nothing_until_restored(tmp_path):
    out = tmp_path / "run"
    train_run(
        run_config(train={"max_steps": 4, "eval_every": 2, "eval_exact_match": 0, "early_stop_metric": "valid_loss"}),
        out,
        log=lambda s: None,
    )
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    cfg = run_config(train={"max_steps": 6, "eval_every": 2, "eval_exact_match": 0, "early_stop_metric": "valid_loss"})
    with pytest.raises(ConfigError, match=r"train.max_steps: 4 -> 6"):
        _open(cfg, out, resume=True)
    opened, _ = _open(cfg, out, resume=True, allow_changes=True)
    assert opened.point is not None and opened.point.step == 4 and opened.changes == ["train.max_steps: 4 -> 6"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # opened, not yet restored
    opened.restored(lambda line: None)
    assert (out / "config_changes.jsonl").exists() and RunDir(out).read_config()[2].max_steps == 6
    # the built model is the run's architecture, freshly initialised: not yet the checkpoint's weights
    saved = opened.point.weights
    assert set(saved) <= {name for name, _ in opened.model.named_parameters()} | set(opened.model.state_dict())
    assert any(not torch.equal(saved[name], t) for name, t in opened.model.state_dict().items() if name in saved)


def test_a_resume_whose_data_gives_other_sizes_is_refused_and_writes_nothing(tmp_path):
    """The run's shape.json is the data's sizes its model was built with: data that now gives others (a
    shape.json edited by hand stands in for a changed tokenizer) is refused in one line naming both."""
    out = tmp_path / "run"
    cfg = run_config(train={"max_steps": 2, "eval_every": 2, "eval_exact_match": 0, "early_stop_metric": "valid_loss"})
    train_run(cfg, out, log=lambda s: None)
    assert RunDir(out).read_shape() == DataShape(vocab_size=40)
    (out / "shape.json").write_text(DataShape(vocab_size=41).to_json())
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(
        ConfigError,
        match=r"shape.json: a resumed run keeps its data's sizes, but its data now gives "
        r"\{'vocab_size': 40, 'pad_id': 0\} \(the run's: \{'vocab_size': 41, 'pad_id': 0\}\)$",
    ):
        _open(cfg, out, resume=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
