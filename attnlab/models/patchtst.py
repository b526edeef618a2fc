"""The PatchTST family (``arch: patchtst``; Nie et al. 2023, "A Time Series is Worth 64 Words"):
channel-independent patches of each series, RevIN, the Transformer's encoder layers and a flatten
head (nn/series.py). The defaults are the paper's ETTh1/ETTh2 settings (input 336, patches of 16
every 8: 42 patches; d_model 16, 4 heads, 3 layers, d_ff 128, dropout 0.3).

The encoder layers are attnlab's, post-norm as the reference places its norms, normalising with
BatchNorm over the tokens by default, as the reference and the paper (``stack.normalisation: layer``
for LayerNorm). Deliberate differences from the reference code (yuqinie98/PatchTST,
PatchTST_supervised): plain attention where it has "residual attention" (each layer's scores added
to the next's), and no dropout inside the feed-forward network; the head flattens patch by patch
(the reference: d_model by d_model, the same map with its columns in another order).

Initialisation: every Linear as the Transformer's (models/transformer.py: Xavier-uniform, zero
bias), where the reference keeps PyTorch's defaults; the position table W_pos U(-0.02, 0.02), as
the reference; RevIN's gamma ones and beta zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.config import at_least
from attnlab.errors import ConfigError
from attnlab.models import transformer as parts
from attnlab.models.family import Capabilities, FamilyConfig, Inputs, ModelFamily, register_family
from attnlab.models.shape import DataShape
from attnlab.models.stack import StackConfig, fields_free_exact
from attnlab.nn.series import FlattenHead, NoNormalisation, Patching, PatchTST, RevIN


@dataclass(frozen=True)
class PatchTSTConfig(FamilyConfig):
    """The channels, input length and horizon are the data's (DataShape); patches of ``patch_length``
    steps every ``patch_stride`` steps; the encoder's fields as the Transformer's; ``head_dropout``
    on the forecast; the stack's ``normalisation``: ``batch`` (TokenBatchNorm, the paper's) or
    ``layer`` (LayerNorm) in the residual blocks; ``revin``: RevIN around the network, with a learned per-channel affine map
    when ``revin_affine`` (off in the paper's runs, the reference's --affine 0).

    ``patch_stride`` may not exceed ``patch_length``: a longer stride would leave steps between
    patches that no patch reads. ``attention_dropout`` is 0, as in the reference (only the
    residual and embedding dropouts are 0.3)."""

    patch_length: int = 16
    patch_stride: int = 8
    stack: StackConfig = StackConfig(
        d_model=16,
        n_heads=4,
        n_layers=3,
        d_ff=128,
        dropout=0.3,
        attention_dropout=0.0,
        activation="gelu",
        normalisation="batch",
    )
    head_dropout: float = 0.0
    revin: bool = True
    revin_affine: bool = False

    def check(self) -> None:
        for name in ("patch_length", "patch_stride"):
            at_least(name, getattr(self, name), 1)
        self.family.check_stack(self.stack)
        if self.patch_stride > self.patch_length:
            raise ConfigError(
                f"patch_stride ({self.patch_stride}) must be at most patch_length ({self.patch_length}): "
                f"a longer stride leaves steps between patches that no patch reads"
            )
        if not 0.0 <= self.head_dropout < 1.0:
            raise ConfigError(f"head_dropout must be in [0, 1) (got {self.head_dropout})")
        if self.revin_affine and not self.revin:
            raise ConfigError("revin_affine is only used with revin: true")

    def check_shape(self, shape: DataShape) -> None:
        if shape.input_length is not None and self.patch_length > shape.input_length:
            raise ConfigError(f"patch_length ({self.patch_length}) must be at most input_length ({shape.input_length})")

    def n_patches(self, shape: DataShape) -> int:
        """N = (L - patch_length) // patch_stride + 2 (the last value repeated patch_stride times)."""
        return Patching(self.patch_length, self.patch_stride).n_patches(shape.need("input_length", "arch 'patchtst'"))


@register_family
class PatchTSTFamily(ModelFamily):
    name = "patchtst"
    config = PatchTSTConfig
    # encoder/decoder mean reading and writing token sequences: a forecaster does neither
    capabilities = Capabilities(
        encoder=False, decoder=False, incremental_decoding=False, attention_weights=True, inputs=Inputs.SERIES
    )
    backends_fit = fields_free_exact  # a function read from the class: no self
    backends_refusal = "is blockwise or approximate, which a series' few patches (42 in the paper) do not need"

    @staticmethod
    def build(cfg: PatchTSTConfig, shape: DataShape) -> PatchTST:
        revin = RevIN(shape.need("n_channels", "arch 'patchtst'"), cfg.revin_affine) if cfg.revin else NoNormalisation()
        n_patches = cfg.n_patches(shape)
        model = PatchTST(
            revin,
            Patching(cfg.patch_length, cfg.patch_stride),
            nn.Linear(cfg.patch_length, cfg.stack.d_model),
            n_patches,
            cfg.stack.dropout,
            parts.plain_encoder(cfg, cfg.stack.n_layers),
            FlattenHead(n_patches, cfg.stack.d_model, shape.need("horizon", "arch 'patchtst'"), cfg.head_dropout),
        )
        parts.init_weights(model)
        nn.init.uniform_(model.positions, -0.02, 0.02)
        return model
