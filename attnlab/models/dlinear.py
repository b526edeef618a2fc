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
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, SeriesSizes, register_family
from attnlab.nn.series import ChannelLinear, DLinear, SeriesDecomposition


@dataclass(frozen=True)
class DLinearConfig(FamilyConfig, SeriesSizes):
    """The channels, input length and horizon (set by the data); ``kernel_size``: the moving
    average's width, odd (a centred window) and at most input_length; ``individual``: one pair of
    maps per channel instead of one pair shared by all."""

    n_channels: int
    input_length: int
    horizon: int
    kernel_size: int = 25
    individual: bool = False

    def check(self) -> None:
        self.check_series()
        at_least("kernel_size", self.kernel_size, 1)
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd, a window centred on each step (got {self.kernel_size})")
        if self.kernel_size > self.input_length:
            raise ConfigError(f"kernel_size ({self.kernel_size}) must be at most input_length ({self.input_length})")


@register_family
class DLinearFamily(ModelFamily):
    name = "dlinear"
    config = DLinearConfig
    # encoder/decoder mean reading and writing token sequences: a forecaster does neither
    capabilities = Capabilities(encoder=False, decoder=False, incremental_decoding=False, attention_weights=False,
                                inputs=Inputs.SERIES)

    @staticmethod
    def build(cfg: DLinearConfig) -> DLinear:
        def over_time() -> nn.Module:
            if cfg.individual:
                return ChannelLinear(cfg.n_channels, cfg.input_length, cfg.horizon)
            return nn.Linear(cfg.input_length, cfg.horizon)

        model = DLinear(SeriesDecomposition(cfg.kernel_size), over_time(), over_time())
        for part in (model.seasonal, model.trend):
            nn.init.constant_(part.weight, 1 / cfg.input_length)
        return model
