"""The naive forecast (``arch: last_value``): every future step is the last value seen, channel by
channel (nn/series.py). The baseline a forecaster must beat; it has no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, SeriesSizes, register_family
from attnlab.nn.series import LastValue


@dataclass(frozen=True)
class LastValueConfig(FamilyConfig, SeriesSizes):
    """The channels, input length and horizon (set by the data); nothing else to choose."""

    n_channels: int
    input_length: int
    horizon: int

    def check(self) -> None:
        self.check_series()


@register_family
class LastValueFamily(ModelFamily):
    name = "last_value"
    config = LastValueConfig
    # encoder/decoder mean reading and writing token sequences: a forecaster does neither
    capabilities = Capabilities(encoder=False, decoder=False, incremental_decoding=False, attention_weights=False,
                                inputs=Inputs.SERIES)

    @staticmethod
    def build(cfg: LastValueConfig) -> LastValue:
        return LastValue(cfg.horizon)
