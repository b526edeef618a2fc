"""Model families as plug-ins: the registry, capabilities, and a family registered from outside the
package that trains through the normal command line."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from attnlab import FAMILIES, ConfigError, build_model, model_config, register_family
from attnlab.config import at_least
from attnlab.models import Capabilities, FamilyConfig, ModelFamily
from attnlab.train.checkpoint import load_run
from helpers import run_cli


@dataclass(frozen=True)
class BigramConfig(FamilyConfig):
    """A bigram language model: each token's embedding predicts the next token."""

    vocab_size: int
    d_model: int = 16
    pad_id: int = 0

    def check(self) -> None:
        at_least("d_model", self.d_model, 1)


class BigramLM(nn.Module):
    def __init__(self, cfg: BigramConfig) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) logits of the next token."""
        return self.generator(self.embed(ids))


class BigramFamily(ModelFamily):
    name = "test_bigram"
    config = BigramConfig
    capabilities = Capabilities(encoder=False, decoder=True, incremental_decoding=False, attention_weights=False)

    @staticmethod
    def build(cfg: BigramConfig) -> BigramLM:
        return BigramLM(cfg)


@pytest.fixture(autouse=True, scope="module")
def bigram_registered():
    """Registered for this module's tests only: other tests list the families (in error messages)."""
    register_family(BigramFamily)
    yield
    del FAMILIES[BigramFamily.name]


def test_the_built_in_families_and_their_capabilities():
    assert list(FAMILIES)[:4] == ["encoder_decoder", "decoder_lm", "encoder_only", "rnn"]
    can = {name: FAMILIES[name].capabilities for name in ("encoder_decoder", "decoder_lm", "encoder_only", "rnn")}
    assert [(c.encoder, c.decoder, c.incremental_decoding, c.attention_weights) for c in can.values()] == [
        (True, True, True, True), (False, True, True, True), (True, False, False, True), (True, True, True, False)]
    assert model_config(arch="rnn", vocab_size=9).capabilities is can["rnn"]


def test_a_family_owns_its_fields_and_round_trips():
    cfg = model_config(arch="test_bigram", vocab_size=11, d_model=4)
    assert cfg.to_dict() == {"arch": "test_bigram", "vocab_size": 11, "d_model": 4, "pad_id": 0}
    assert model_config(cfg.to_dict()) == cfg
    assert sum(p.numel() for p in build_model(cfg).parameters()) == 11 * 4 + 4 * 11 + 11
    with pytest.raises(ConfigError, match=r"model.arch 'test_bigram' has no field 'n_heads'; its fields: "
                                          r"vocab_size, d_model, pad_id"):
        model_config(arch="test_bigram", vocab_size=11, n_heads=2)


def test_registering_a_second_family_under_a_taken_name_is_refused():
    class Impostor(BigramFamily):
        pass

    with pytest.raises(ValueError, match="a model family named 'test_bigram' is already registered"):
        register_family(Impostor)


def test_a_family_from_outside_the_package_trains_through_the_command_line(tmp_path):
    (tmp_path / "text.txt").write_text("abab abab abab abab\n" * 60)
    config = tmp_path / "bigram.yaml"
    config.write_text(f"""\
model: {{arch: test_bigram, d_model: 8}}
data: {{format: text, train: {tmp_path}/text.txt, tokenizer: char, block_size: 16}}
train: {{max_steps: 30, batch_size: 8, lr_schedule: constant, lr: 0.05, warmup_steps: 1, eval_every: 30,
        log_every: 1, progress: false}}
""")
    done = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "model: test_bigram, 136 parameters" in done.stdout  # V = 4 specials + a, b, space, newline: 2 x 8 x 8 + 8
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["split"] == "train"]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]  # from ln 8 towards what a bigram can know of "abab abab"
    model, _, cfg = load_run(tmp_path / "run")
    assert isinstance(model, BigramLM) and cfg.arch == "test_bigram"
    refused = run_cli("translate", str(tmp_path / "run"), stdin="a b\n")
    assert refused.returncode == 2 and refused.stderr == (
        f"error: {tmp_path / 'run'} holds a model of arch 'test_bigram'; `attnlab translate` needs 'encoder_decoder' "
        f"or 'rnn'\n")
    refused = run_cli("generate", str(tmp_path / "run"), "--seed", "1")  # sampling needs a cache
    assert refused.returncode == 2 and "`attnlab generate` needs 'decoder_lm'" in refused.stderr
