"""How fast can PyTorch sample from the character model on this CPU at all? (docs/performance/character_lm.md)

The smallest possible sampler of the model in configs/shakespeare_char.yaml (4 layers, 4 heads,
d_model 128, 65 characters, 64 positions), written nanoGPT-style for batch 1 with a static KV cache
(keys written in place with index_copy_, one fused attention call per layer, no padding, no
options), random weights. It times 63 new tokens after a 1-token prompt, as `attnlab bench lm`
does, in eager mode, under torch.compile, and under torch.compile with Inductor's C++ wrapper.
Nothing of attnlab is imported: this is the floor that any PyTorch implementation of the model
stands on, not attnlab's own figure.

    .venv/bin/python docs/experiments/lm_sampling_floor.py
"""

import time

import torch
import torch.nn.functional as F
from torch import nn

D, H, LAYERS, VOCAB, T = 128, 4, 4, 65, 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ff1, self.ff2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("k", torch.zeros(1, H, T, D // H))
        self.register_buffer("v", torch.zeros(1, H, T, D // H))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).view(1, 1, 3, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(1, 1, D))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool).tril())

    def forward(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x, mask = self.tokens(token) + self.positions(pos), self.causal[pos][None, None]
        for block in self.blocks:
            x = block(x, pos, mask)
        return self.head(self.ln(x))[:, -1]


def main() -> None:
    torch.manual_seed(0)
    model = TinyGPT().eval()

    def step(token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(model(token, pos).softmax(-1), 1)

    def tokens_per_second(fn) -> float:
        def generate() -> None:
            token = torch.zeros(1, 1, dtype=torch.long)
            for i in range(T - 1):
                token = fn(token, torch.tensor([i]))

        generate(), generate()  # warm-up (and compilation)
        start = time.perf_counter()
        for _ in range(10):
            generate()
        return 10 * (T - 1) / (time.perf_counter() - start)

    import torch._inductor.config as inductor

    with torch.no_grad():
        print(f"eager:                  {tokens_per_second(step):7.0f} tokens/s")
        print(f"torch.compile:          {tokens_per_second(torch.compile(step)):7.0f} tokens/s")
        torch._dynamo.reset()
        inductor.cpp_wrapper = True
        print(f"torch.compile + C++ wrapper: {tokens_per_second(torch.compile(step)):7.0f} tokens/s")


if __name__ == "__main__":
    main()
