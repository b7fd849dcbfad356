"""DDP with gradient accumulation (CPU, gloo): `no_sync()` on all but the last of K micro-batches per step.

    torchrun --standalone --nproc_per_node=2 examples/grad_accum.py
    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof examples/grad_accum.py --accum 4 --workers 2

As PyTorch's DDP documentation writes accumulation: the first K-1 micro-batches run forward and backward inside
`model.no_sync()` (gradients accumulate locally, no all-reduce); the K-th runs outside it, so its backward all-reduces
the accumulated gradients; then one optimizer step. Micro-batches come from a `DataLoader` over a map-style dataset
(`--workers N` loads them in N worker processes; 0 loads in the training process).

`--slow-rank R --slow-ms X` makes rank R X ms slower per step (before the synchronising backward): the other ranks
wait for it in that all-reduce.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomSamples(Dataset):
    """Deterministic random (features, class) pairs."""

    def __init__(self, n: int, dim: int) -> None:
        self.n, self.dim = n, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), int(torch.randint(0, 10, (1,), generator=g))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step (K)")
    p.add_argument("--micro-batch", type=int, default=16, help="samples per micro-batch and rank")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (0: load in this process)")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that is --slow-ms slower per step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    if distributed:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data = RandomSamples(args.steps * args.accum * args.micro_batch * world, args.dim)
    sampler = DistributedSampler(data, shuffle=False) if distributed else None
    loader = DataLoader(data, batch_size=args.micro_batch, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    batches = iter(loader)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        for i in range(args.accum):
            x, y = next(batches)
            last = i == args.accum - 1
            sync = contextlib.nullcontext() if last or not distributed else model.no_sync()
            with sync:
                loss = loss_fn(model(x), y) / args.accum
                if last and rank == args.slow_rank and args.slow_ms > 0:
                    time.sleep(args.slow_ms / 1000.0)
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(f"grad_accum: {args.steps} steps x {args.accum} micro-batches on {world} rank(s) in {elapsed:.2f} s, "
              f"last loss {loss.item() * args.accum:.4f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
