"""A pre-trained encoder with no head of its own: what `attnlab import-hf` makes of a Hugging Face
``BertModel`` (all-MiniLM-L6-v2, ...), which has an encoder and a pooler but no masked-LM head.
Nothing here trains or predicts: such a run is a starting point (``train.init_from`` in a
classification or masked-LM config, which fine-tunes it) and a model to `inspect`. Its data
section only says how it reads text: its tokenizer and ``max_len``."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from attnlab.config import flattened
from attnlab.errors import ConfigError
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.parts import Text, Truncation
from attnlab.tasks.task import Task, TaskConfig, register_task


def _untrainable() -> ConfigError:
    return ConfigError(
        "data.task 'encoder' is a pre-trained encoder with no head to train; fine-tune it from a "
        "classification or masked_lm config with train.init_from: RUN"
    )


@dataclass(frozen=True)
class EncoderConfig(TaskConfig):
    """How the encoder reads text: its ``tokenizer`` (``vocab_size`` entries) and inputs of at most
    ``max_len`` tokens, <bos> and <eos> included (Truncation, written flat)."""

    text: Text = Text(tokenizer="wordpiece")
    truncation: Truncation = flattened(Truncation(max_len=512))

    def check_trainable(self) -> None:
        raise _untrainable()

    @property
    def longest_sequence(self) -> int:
        return self.truncation.max_len


@register_task
class TextEncoder(Task[None, None]):
    """An encoder's states of a text, for inspection (data.task: encoder): an imported model that has no
    training task of its own here."""

    name = "encoder"
    config = EncoderConfig
    needs = {"encoder": True, "decoder": False}
    metrics = {"valid_loss": True}
    commands = ("inspect",)
    tokenizers = ("src",)
    untrained = ("mlm_head.", "classifier.out.")  # BertModel has the pooler (classifier.pool), no head

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> typing.NoReturn:
        raise _untrainable()
