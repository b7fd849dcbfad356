"""FSDP2 training (CPU, gloo): `fully_shard` on each block and the root, as PyTorch's FSDP2 examples write it.

    torchrun --standalone --nproc_per_node=2 examples/fsdp2.py
    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof examples/fsdp2.py --slow-rank 1 --slow-ms 30
    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof examples/fsdp2.py --checkpoint ck.pt

A small pre-norm transformer-style stack (token embedding, `--layers` blocks of self-attention + MLP, a head) whose
parameters are sharded over all ranks: each block all-gathers its parameters before its forward and backward and
reduce-scatters its gradients. `--slow-rank R --slow-ms X` makes rank R's forward X ms slower per step (every other
rank waits for it at the next all-gather). `--checkpoint PATH` saves the full model and optimizer state after the
loop the way torch.distributed.checkpoint's state_dict API does it (`get_state_dict` with `full_state_dict=True`:
all-gathers on every rank, rank 0 writes the file), marked `record_function("checkpoint")`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, slow_s: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.slow_s = slow_s

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.slow_s > 0:
            time.sleep(self.slow_s)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).flatten(0, 1))  # (batch * seq, vocab) logits


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="training iterations")
    p.add_argument("--batch", type=int, default=8, help="per-rank batch size (sequences)")
    p.add_argument("--seq", type=int, default=16, help="sequence length")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1, help="rank whose forward is --slow-ms slower per step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--checkpoint", default="", help="after the loop, save the full state to this file (rank 0)")
    p.add_argument("--compile", action="store_true", help="compile each block (block.compile(), before fully_shard)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend")
    return p.parse_args()


def save_checkpoint(model: nn.Module, opt: torch.optim.Optimizer, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    with torch.profiler.record_function("checkpoint"):
        model_sd, opt_sd = get_state_dict(model, opt,
                                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            torch.save({"model": model_sd, "optim": opt_sd}, path)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    slow_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0
    model = Transformer(args.vocab, args.dim, args.heads, args.layers, slow_s)
    for layer in model.layers:
        if args.compile:  # per block, before sharding, as torchtitan does
            layer.compile(backend=args.compile_backend)
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y.reshape(-1))
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    if args.checkpoint:
        save_checkpoint(model, opt, args.checkpoint)
    if rank == 0:
        print(f"fsdp2: {args.steps} steps on {world} rank(s) in {elapsed:.2f} s, last loss {loss.item():.4f}"
              + (f"; saved {args.checkpoint}" if args.checkpoint else ""), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
