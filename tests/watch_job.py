"""A small data-parallel job for the watch tests (torchrun + distprof.launch --watch).

    torchrun --nproc_per_node=2 -m distprof.launch --watch --schedule none tests/watch_job.py \
        --steps 200 --slow-rank 1 --slow-from 60 --slow-ms 30

Gradients are averaged with one synchronous ``dist.all_reduce`` per step (the rank that is late makes the others
wait there). Every step sleeps --sleep-ms on every rank (a paced job that leaves the CPU to the others on a loaded
machine); from step --slow-from on (until --slow-until, and again in --slow-again A:B), --slow-rank sleeps --slow-ms
more, before the all-reduce (its own work).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep-ms", type=float, default=20.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=60)
    p.add_argument("--slow-until", type=int, default=1 << 30, help="the slow rank is slow in [from, until) ...")
    p.add_argument("--slow-again", type=str, default="", help="... and again in A:B")
    p.add_argument("--slow-ms", type=float, default=30.0)
    args = p.parse_args()
    again = tuple(int(v) for v in args.slow_again.split(":")) if args.slow_again else (-1, -1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        time.sleep(args.sleep_ms / 1000)
        if rank == args.slow_rank and (args.slow_from <= step < args.slow_until or again[0] <= step < again[1]):
            time.sleep(args.slow_ms / 1000)
        flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
        dist.all_reduce(flat)
        flat /= world
        off = 0
        for q in model.parameters():
            q.grad.copy_(flat[off:off + q.numel()].view_as(q))
            off += q.numel()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
