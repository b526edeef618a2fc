"""The naive forecast (``arch: last_value``): every future step is the last value seen, channel by
channel (nn/series.py). The baseline a forecaster must beat; it has no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.nn.series import LastValue


@dataclass(frozen=True)
class LastValueConfig(FamilyConfig):
    """Nothing to choose: the horizon is the data's (DataShape)."""


@register_family
class LastValueFamily(ModelFamily):
    name = "last_value"
    config = LastValueConfig
    # encoder/decoder mean reading and writing token sequences: a forecaster does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=False, inputs=Inputs.SERIES
    )

    @staticmethod
    def build(cfg: LastValueConfig, shape: DataShape) -> LastValue:
        return LastValue(shape.need("horizon", "arch 'last_value'"))
