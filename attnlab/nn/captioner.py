"""An image captioner ("Show, Attend and Tell" with Transformers): the ViT's encoder reads the
image as a sequence of patch states, and the Transformer's decoder writes the caption,
cross-attending to them.

    memory = Encoder(x_p^1 E + E_pos^1, ..., x_p^N E + E_pos^N)     (B, N, d_model), every patch a key
    logits = Generator(Decoder(Embed(BOS y_1 ... y_{T-1}), memory))

It has the encoder-decoder's interface (``encode``, ``decode``, ``new_cache``), so training by
teacher forcing, greedy and beam search and the KV cache (decode/search.py) work on it as they
do on a translation model: only the source is an image.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.embeddings import Embeddings
from attnlab.nn.encoder_decoder import TransformerTargetSide
from attnlab.nn.layers import Encoder, Seq2SeqDecoder
from attnlab.nn.positional import PositionalEncoding
from attnlab.nn.tensor_plan import TensorPlan, megatron
from attnlab.nn.vision import PatchEmbedding, PatchEncoding, PatchMean


class ImageCaptioner(PatchEncoding, TransformerTargetSide):
    """``model(images, tgt_in)``: (B, C, H, W) images, (B, T) ids BOS y_1 ... -> (B, T, V) logits."""

    def __init__(
        self,
        patch_embed: PatchEmbedding,
        positional: PositionalEncoding,
        encoder: Encoder,
        tgt_embed: Embeddings,
        decoder: Seq2SeqDecoder,
        generator: nn.Module,
        pad_id: int,
    ) -> None:
        super().__init__()
        self.patch_embed, self.positional, self.summary = patch_embed, positional, PatchMean(0)  # every patch a key
        self.encoder = encoder
        self.tgt_embed, self.decoder, self.generator = tgt_embed, decoder, generator
        self.pad_id = pad_id

    def encode(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """(B, C, H, W) -> memory (B, N, d_model), the patch states, and its validity (B, N): all
        True, an image has no padding."""
        memory = self.encode_patches(images)
        return memory, torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)

    def tensor_plan(self) -> TensorPlan:
        """Megatron's split of the image encoder's and the decoder's layers (train.strategy tp, nn/tensor_plan.py)."""
        return megatron(self, "encoder", "decoder")
