"""A Llama-style decoder built from its configuration, with no weights to download: the
shapes of Llama 3's 8B, 70B and 405B (and a debug size that computes on a CPU), for training
steps on simulated GPUs.

    from llama import CONFIGS, Transformer, build, shard, train_step

    with torch.device("meta"):                   # shapes only: no memory for 8B
        model = Transformer(CONFIGS["8B"])
    model.parameter_count()                      # 8,030,261,248

    model = Transformer(CONFIGS["debug"]).cuda()
    shard(model, mesh, checkpoint_activations=True)   # FSDP2 per block, then the root

    model = build(CONFIGS["8B"], mesh)           # on meta, sharded, then each rank's shards
    mesh = init_device_mesh("cuda", (64, 8), mesh_dim_names=("dp", "tp"))
    model = build(CONFIGS["405B"], mesh)         # 2D: tensor parallel in 8, FSDP2 over 64
    train_step(model, torch.optim.AdamW(model.parameters()), batch=1, seq=2048)

The layers are Llama's: token embedding, blocks of RMSNorm, grouped-query attention with
rotary embeddings (torch's scaled_dot_product_attention, causal) and a SwiGLU feed-forward
network, a final RMSNorm and an untied output projection.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Config:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim_multiplier: float
    multiple_of: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192

    @property
    def ffn_hidden(self) -> int:
        """Llama's feed-forward width: 2/3 of 4 * dim, scaled, rounded up to multiple_of."""
        hidden = int(self.ffn_dim_multiplier * int(2 * 4 * self.dim / 3))
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


CONFIGS = {
    "debug": Config(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                    ffn_dim_multiplier=1.3, multiple_of=32, max_seq_len=64),
    "8B": Config(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256,
                 ffn_dim_multiplier=1.3, multiple_of=1024),
    "70B": Config(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256,
                  ffn_dim_multiplier=1.3, multiple_of=4096),
    "405B": Config(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, vocab_size=128256,
                   ffn_dim_multiplier=1.2, multiple_of=4096),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary(x, theta: float):
    """x (batch, seq, heads, head_dim) rotated by its positions, Llama's way."""
    seq, head_dim = x.shape[1], x.shape[-1]
    frequencies = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=x.device).float(), frequencies)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads, self.kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.dim // config.n_heads
        self.theta = config.rope_theta
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x):
        # The heads this rank holds: all of them, or its share under tensor parallelism.
        batch, seq, _ = x.shape
        q = rotary(self.wq(x).view(batch, seq, -1, self.head_dim), self.theta)
        k = rotary(self.wk(x).view(batch, seq, -1, self.head_dim), self.theta)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        repeat = self.heads // self.kv_heads  # grouped-query attention
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def init_weights(self) -> None:
        """Llama's initial values: normal(0, 0.02) weights, RMSNorm's ones."""
        init_weights(self)


@torch.no_grad()
def init_weights(model: nn.Module) -> None:
    """normal(0, 0.02) weights of linear layers and embeddings, zero biases, norms' ones
    (RMSNorm's; LayerNorm's, with zero biases)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(module.weight)
        if isinstance(getattr(module, "bias", None), torch.Tensor):
            nn.init.zeros_(module.bias)


def train_step(model: Transformer, optimizer, batch: int, seq: int, accumulate: int = 1,
               loss: str = "float32"):
    """One step on random tokens, batch x seq (at most the model's max_seq_len) a
    micro-batch: `accumulate` times forward, the next-token loss and backward, then the
    optimizer's step and its gradients freed (zero_grad), as a training loop does before
    its next step. The loss is computed on the logits made float32 (torchtitan's), or with
    loss="fused" on the logits as they are, as a fused cross-entropy kernel does
    (llm-foundry's): no float32 copy of them. Returns the last micro-batch's loss."""
    if loss not in ("float32", "fused"):
        raise ValueError(f"loss={loss!r}: use \"float32\" or \"fused\"")
    config = model.config
    seq = min(seq, config.max_seq_len)
    for _ in range(accumulate):
        tokens = torch.randint(0, config.vocab_size, (batch, seq + 1)).cuda()
        logits = model(tokens[:, :-1])
        with loss_context(logits):
            if loss == "float32":
                logits = logits.float()
            loss_value = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss_value.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss_value


def loss_context(logits):
    """Under tensor parallelism the logits stay sharded over the vocabulary (a DTensor) and
    the loss is computed on the shards, as torchtitan's loss parallelism does; otherwise
    nothing changes."""
    from contextlib import nullcontext

    from torch.distributed.tensor import DTensor

    if not isinstance(logits, DTensor):
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def build(config: Config, mesh, checkpoint_activations: bool | str = False,
          mixed_precision: bool = False) -> Transformer:
    """A model larger than one GPU, made as torchtitan makes it: on the meta device, then
    sharded (`shard`), then each rank's shards allocated on its GPU and initialised, so no
    GPU ever holds the whole model."""
    with torch.device("meta"):
        model = Transformer(config)
    shard(model, mesh, checkpoint_activations, mixed_precision)
    model.to_empty(device="cuda")
    model.init_weights()
    return model


def _selective_context():
    """torchtitan's per-operator selective activation checkpointing: a block's matmul
    outputs are kept, but every second one, and so are its attention's and its reductions';
    the rest is recomputed in backward."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    ops = torch.ops
    save = {ops.aten.mm.default, ops.aten._scaled_dot_product_efficient_attention.default,
            ops.aten._scaled_dot_product_flash_attention.default, ops.aten.max.default,
            ops._c10d_functional.reduce_scatter_tensor.default}
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == ops.aten.mm.default:
            counts[key] += 1
        keep = func in save and not (func == ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def tensor_parallel(model: Transformer, mesh) -> Transformer:
    """Tensor and sequence parallelism over `mesh` (one dimension) as torchtitan applies it
    to Llama: the attention's and feed-forward's input projections split by columns (each
    rank its heads, its share of the hidden width), their output projections by rows, the
    norms' activations split over the sequence, the embedding by rows and the output
    projection by columns, its logits left sharded over the vocabulary for the loss
    (`train_step` computes it on the shards)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    ranks, config = mesh.size(), model.config
    if config.n_kv_heads % ranks or config.ffn_hidden % ranks:
        raise ValueError(f"tensor parallelism over {ranks} ranks: the model's "
                         f"{config.n_kv_heads} key/value heads and feed-forward width "
                         f"{config.ffn_hidden} must each be a multiple of it")
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                  use_local_output=False),
    })
    block_plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, mesh, block_plan)
    return model


def shard(model: Transformer, mesh, checkpoint_activations: bool | str = False,
          mixed_precision: bool = False) -> Transformer:
    """FSDP2 as torchtitan applies it: each block a unit (its activations recomputed in
    backward when asked: True or "full" recomputes the whole block, "selective" as
    torchtitan's per-operator policy does), then the root (embeddings, final norm, output); with
    mixed_precision, torchtitan's default policy: parameters gathered and computed in
    bfloat16, gradients reduced in float32. A mesh with dimensions named "dp" and "tp" is
    torchtitan's 2D parallelism: tensor parallelism over "tp" first (`tensor_parallel`),
    then FSDP2 over "dp"."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if mixed_precision else MixedPrecisionPolicy())

    ac = {False: "none", True: "full"}.get(checkpoint_activations, checkpoint_activations)
    if ac not in ("none", "full", "selective"):
        raise ValueError(f"checkpoint_activations={checkpoint_activations!r}: use False or "
                         "\"none\", True or \"full\", or \"selective\"")
    if "tp" in (mesh.mesh_dim_names or ()):
        tensor_parallel(model, mesh["tp"])
        mesh = mesh["dp"]
    for index, layer in enumerate(model.layers):
        if ac != "none":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper)

            layer = (checkpoint_wrapper(layer) if ac == "full" else
                     checkpoint_wrapper(layer, context_fn=_selective_context,
                                        preserve_rng_state=False))
            model.layers[index] = layer
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
