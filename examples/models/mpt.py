"""An MPT-style decoder (MosaicML's llm-foundry) built from its configuration, with no
weights to download: the shapes of the models in llm-foundry's published training
benchmarks (scripts/train/benchmarking/README.md there), so that those measurements can be
run again on simulated GPUs.

    from mpt import CONFIGS, build
    model = build(CONFIGS["mpt-7b"].at(seq=2048), mesh)   # FSDP2 per block, then the root

The layers are those benchmarks' MPT: token and learned position embeddings, blocks of
LayerNorm, multi-head attention (one fused query-key-value projection, torch's
scaled_dot_product_attention, causal) and a feed-forward network of 4 x dim with GELU, a
final LayerNorm and the output tied to the token embedding; every linear layer and norm
has a bias. The parameter counts equal the benchmarks' NumParams column (6,658,859,008 for
the 7B at sequence 2048).

A model here has what llama.py's training step and sharding take of one: `config`
(`vocab_size`, `max_seq_len`), `layers` and `init_weights()`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int = 50368
    expansion: int = 4
    max_seq_len: int = 2048  # the learned position embedding's length

    def at(self, seq: int) -> "Config":
        """The same model for sequences of `seq` tokens (its position embedding that long)."""
        return dataclasses.replace(self, max_seq_len=seq)


CONFIGS = {
    "mpt-debug": Config(dim=64, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=64),
    "mpt-760m": Config(dim=1536, n_layers=24, n_heads=12),
    "mpt-1b": Config(dim=2048, n_layers=24, n_heads=16),
    "mpt-3b": Config(dim=2560, n_layers=32, n_heads=20),
    "mpt-7b": Config(dim=4096, n_layers=32, n_heads=32),
    "mpt-13b": Config(dim=5120, n_layers=40, n_heads=40),
}


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads = config.n_heads
        self.Wqkv = nn.Linear(config.dim, 3 * config.dim)
        self.out_proj = nn.Linear(config.dim, config.dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.Wqkv(x).view(batch, seq, 3, self.heads, dim // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.norm_1 = nn.LayerNorm(config.dim)
        self.attn = Attention(config)
        self.norm_2 = nn.LayerNorm(config.dim)
        self.up_proj = nn.Linear(config.dim, config.expansion * config.dim)
        self.down_proj = nn.Linear(config.expansion * config.dim, config.dim)

    def forward(self, x):
        x = x + self.attn(self.norm_1(x))
        return x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x))))


class Transformer(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.dim)
        self.wpe = nn.Embedding(config.max_seq_len, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.dim)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.norm_f(x), self.wte.weight)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def init_weights(self) -> None:
        """normal(0, 0.02) weights, zero biases, LayerNorm's ones (llama.init_weights)."""
        llama.init_weights(self)


def build(config: Config, mesh, checkpoint_activations: bool | str = False,
          mixed_precision: bool = False) -> Transformer:
    """Made as llama.build makes Llama: on the meta device, sharded (llama.shard: each block
    a unit, then the root), then each rank's shards allocated on its GPU and initialised."""
    with torch.device("meta"):
        model = Transformer(config)
    llama.shard(model, mesh, checkpoint_activations, mixed_precision)
    model.to_empty(device="cuda")
    model.init_weights()
    return model
