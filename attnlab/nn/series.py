"""Multivariate time-series forecasting: from x of (B, L, C), the last L steps of C channels, the
next H steps, (B, H, C), in the same (already standardised) units. ``model.forecast(x)``.

PatchTST  (Nie et al. 2023, "A Time Series is Worth 64 Words"): each channel on its own, normalised
          by RevIN, cut into overlapping patches, read by a Transformer encoder, and a linear head
          from all the patches' states to the H steps.
DLinear   (Zeng et al. 2023, "Are Transformers Effective for Time Series Forecasting?"): a moving
          average splits the series into trend and seasonal parts, each mapped L -> H linearly.
LastValue the naive forecast: the last value seen, H times.
"""

from __future__ import annotations

import math
from typing import Callable, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.dropout import Dropout
from attnlab.nn.layers import Encoder
from attnlab.nn.tensor_plan import TensorPlan, megatron

Statistics = tuple[Tensor, Tensor]  # (B, 1, C) mean and (B, 1, C) standard deviation of each instance


# -- PatchTST --------------------------------------------------------------------------------------


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al. 2022): each series (one instance, one channel)
    standardised over its L steps, the forecast mapped back with the same statistics.

        x' = (x - mean) / stdev * gamma + beta            stdev = sqrt(Var(x) + eps), Var unbiased=False
        y  = (y' - beta) / (gamma + eps^2) * stdev + mean

    gamma (ones) and beta (zeros) are learned per channel when ``affine``; the statistics are
    constants to the gradient, as in the reference code."""

    def __init__(self, n_channels: int, affine: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(n_channels)) if affine else None
        self.beta = nn.Parameter(torch.zeros(n_channels)) if affine else None

    def normalise(self, x: Tensor) -> tuple[Tensor, Statistics]:
        """(B, L, C) -> (B, L, C) x' and the statistics that ``denormalise`` needs."""
        mean = x.mean(1, keepdim=True).detach()  # (B, 1, C)
        stdev = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + self.eps).detach()  # (B, 1, C)
        x = (x - mean) / stdev
        if self.gamma is not None:
            assert self.beta is not None  # made with gamma (affine)
            x = x * self.gamma + self.beta
        return x, (mean, stdev)

    def denormalise(self, y: Tensor, statistics: Statistics) -> Tensor:
        """(B, H, C) y' -> (B, H, C) y."""
        mean, stdev = statistics
        if self.gamma is not None:
            assert self.beta is not None  # made with gamma (affine)
            y = (y - self.beta) / (self.gamma + self.eps * self.eps)
        return y * stdev + mean


class NoNormalisation(nn.Module):
    """In place of RevIN when it is off: the series as they come."""

    def normalise(self, x: Tensor) -> tuple[Tensor, None]:
        return x, None

    def denormalise(self, y: Tensor, statistics: None) -> Tensor:
        return y


class Patching(nn.Module):
    """A univariate series cut into patches of ``length`` steps every ``stride`` steps, after its
    last value is repeated ``stride`` more times (the reference's padding 'end'), so that the last
    patch reaches the last step: N = (L - length) // stride + 2 patches; patch k is steps
    k stride ... k stride + length - 1."""

    def __init__(self, length: int, stride: int) -> None:
        super().__init__()
        self.length, self.stride = length, stride

    def n_patches(self, input_length: int) -> int:
        return (input_length - self.length) // self.stride + 2

    def forward(self, x: Tensor) -> Tensor:
        """(..., L) -> (..., N, length)."""
        padded = torch.cat([x, x[..., -1:].expand(*x.shape[:-1], self.stride)], dim=-1)  # (..., L + stride)
        return padded.unfold(-1, self.length, self.stride)


class FlattenHead(nn.Module):
    """PatchTST's forecast of one channel: all its patches' final states, flattened (patch by
    patch), mapped linearly to the H steps; dropout on the result, where the reference puts it."""

    def __init__(self, n_patches: int, d_model: int, horizon: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(n_patches * d_model, horizon)
        self.dropout = Dropout(dropout)

    def forward(self, z: Tensor) -> Tensor:
        """(..., N, d_model) -> (..., H)."""
        return self.dropout(self.linear(z.flatten(-2)))


class PatchTST(nn.Module):
    """``model.forecast(x)``: (B, L, C) -> (B, H, C). Channel independence: the C series of an
    instance are B C univariate series, each read by the same weights, alone.

        x'      = RevIN(x)                                  each channel standardised over its steps
        x_p     = Patching(x'_c)                            (N, P) patches of each channel c
        z_0     = Dropout(x_p W_P + W_pos)                  W_pos: one learned vector per patch index
        z       = Encoder(z_0)                              the Transformer's encoder layers
        y_c     = FlattenHead(z)                            (H,) forecast of channel c
        y       = RevIN^-1([y_1 ... y_C])
    """

    def __init__(
        self,
        revin: RevIN | NoNormalisation,
        patching: Patching,
        patch_embed: nn.Linear,
        n_patches: int,
        dropout: float,
        encoder: Encoder,
        head: FlattenHead,
    ) -> None:
        super().__init__()
        self.revin, self.patching, self.patch_embed = revin, patching, patch_embed
        self.positions = nn.Parameter(torch.zeros(n_patches, patch_embed.out_features))  # W_pos (N, d_model)
        self.dropout = Dropout(dropout)
        self.encoder, self.head = encoder, head

    def encode_normalised(self, x: Tensor) -> Tensor:
        """(B, L, C) normalised series -> (B C, N, d_model) the final states of their patches."""
        patches = self.patching(x.transpose(1, 2).flatten(0, 1))  # (B C, L) -> (B C, N, P)
        z = self.dropout(self.patch_embed(patches) + self.positions)  # (B C, N, d_model)
        every_patch = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)  # (B C, N): no padding
        indices = torch.arange(z.shape[1], device=z.device)  # (N,): no scheme inside attention reads them
        return self.encoder(z, every_patch, indices)

    def encode(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B C, N, d_model): what attention analysis runs (series b's channel c is row b C + c)."""
        return self.encode_normalised(self.revin.normalise(x)[0])

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the encoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder")

    def forecast(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, C)."""
        x, statistics = self.revin.normalise(x)  # (B, L, C)
        z = torch.unflatten(self.encode_normalised(x), 0, (x.shape[0], x.shape[2]))  # (B, C, N, d_model)
        y = self.head(z).transpose(1, 2)  # (B, C, H) -> (B, H, C)
        # the statistics go back to the normaliser that made them (RevIN's pair, NoNormalisation's None):
        # a pairing that a union of the two classes does not carry
        denormalise = cast(Callable[[Tensor, "Statistics | None"], Tensor], self.revin.denormalise)
        return denormalise(y, statistics)

    forward = forecast


# -- DLinear ---------------------------------------------------------------------------------------


class SeriesDecomposition(nn.Module):
    """x = seasonal + trend, the trend a moving average of ``kernel_size`` (odd) steps, centred,
    over the series with its first and last values repeated (kernel_size - 1) / 2 times at its ends."""

    def __init__(self, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, C) -> (B, L, C) seasonal, (B, L, C) trend."""
        pad = (self.kernel_size - 1) // 2
        padded = torch.cat([x[:, :1].expand(-1, pad, -1), x, x[:, -1:].expand(-1, pad, -1)], dim=1)  # (B, L + k - 1, C)
        trend = F.avg_pool1d(padded.transpose(1, 2), self.kernel_size, stride=1).transpose(1, 2)  # (B, L, C)
        return x - trend, trend


class ChannelLinear(nn.Module):
    """One linear map L -> H per channel: y_c = W_c x_c + b_c (DLinear's 'individual'); each
    initialised as an nn.Linear(L, H) is, U(-1/sqrt(L), 1/sqrt(L))."""

    def __init__(self, n_channels: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(n_channels, out_features, in_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_channels, out_features).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, L) -> (B, C, H)."""
        return torch.einsum("bcl,chl->bch", x, self.weight) + self.bias


class DLinear(nn.Module):
    """``model.forecast(x)``: (B, L, C) -> (B, H, C).

        seasonal, trend = SeriesDecomposition(x)
        y = W_s seasonal + b_s + W_t trend + b_t            over time, L -> H, for each channel

    The maps are nn.Linear(L, H), shared by the channels, or a ChannelLinear (one pair per channel)."""

    def __init__(
        self, decomposition: SeriesDecomposition, seasonal: nn.Linear | ChannelLinear, trend: nn.Linear | ChannelLinear
    ) -> None:
        super().__init__()
        self.decomposition, self.seasonal, self.trend = decomposition, seasonal, trend

    def forecast(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, C)."""
        seasonal, trend = self.decomposition(x)  # (B, L, C) each
        y = self.seasonal(seasonal.transpose(1, 2)) + self.trend(trend.transpose(1, 2))  # (B, C, H)
        return y.transpose(1, 2)

    forward = forecast


# -- the naive forecast ----------------------------------------------------------------------------


class LastValue(nn.Module):
    """``model.forecast(x)``: (B, L, C) -> (B, H, C), y[:, h] = x[:, L - 1] for every h. Nothing to learn."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon

    def forecast(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, C)."""
        return x[:, -1:].repeat(1, self.horizon, 1)

    forward = forecast
