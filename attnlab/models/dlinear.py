"""The DLinear family (``arch: dlinear``; Zeng et al. 2023, "Are Transformers Effective for Time
Series Forecasting?"): a moving average splits each channel into trend and seasonal parts, each
mapped linearly over time from the L input steps to the H forecast ones (nn/series.py). No RevIN,
as the paper's DLinear.

Initialisation: every weight 1/L, so that each map starts as the mean of the input steps, as the
first releases of the reference code (cure-lab/LTSF-Linear, models/DLinear.py; later kept there
only as a comment "to visualize the weights"); the biases as PyTorch initialises an
nn.Linear(L, H)'s, U(-1/sqrt(L), 1/sqrt(L)), as the reference keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.nn.series import ChannelLinear, DLinear, SeriesDecomposition


@dataclass(frozen=True)
class DLinearConfig(FamilyConfig):
    """The channels, input length and horizon are the data's (DataShape); ``kernel_size``: the moving
    average's width, odd (a centred window) and at most input_length; ``individual``: one pair of
    maps per channel instead of one pair shared by all."""

    kernel_size: int = 25
    individual: bool = False

    def check(self) -> None:
        at_least("kernel_size", self.kernel_size, 1)
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd, a window centred on each step (got {self.kernel_size})")

    def check_shape(self, shape: DataShape) -> None:
        if shape.input_length is not None and self.kernel_size > shape.input_length:
            raise ConfigError(f"kernel_size ({self.kernel_size}) must be at most input_length ({shape.input_length})")


@register_family
class DLinearFamily(ModelFamily):
    name = "dlinear"
    config = DLinearConfig
    # encoder/decoder mean reading and writing token sequences: a forecaster does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=False, inputs=Inputs.SERIES
    )

    @staticmethod
    def build(cfg: DLinearConfig, shape: DataShape) -> DLinear:
        length, horizon = shape.need("input_length", "arch 'dlinear'"), shape.need("horizon", "arch 'dlinear'")

        def over_time() -> nn.Linear | ChannelLinear:
            if cfg.individual:
                return ChannelLinear(shape.need("n_channels", "arch 'dlinear'"), length, horizon)
            return nn.Linear(length, horizon)

        model = DLinear(SeriesDecomposition(cfg.kernel_size), over_time(), over_time())
        for part in (model.seasonal, model.trend):
            nn.init.constant_(part.weight, 1 / length)
        return model
