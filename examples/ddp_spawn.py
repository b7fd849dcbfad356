"""DDP as PyTorch's tutorial writes it ("Getting Started with Distributed Data Parallel"): the script starts its ranks
itself with torch.multiprocessing.spawn and each makes its process group with an explicit rank — no torchrun.

    python -m distprof.launch examples/ddp_spawn.py --world-size 2

distprof's launcher is then no rank: each spawned process is profiled as one, into one run directory
(docs/capture.md, "Scripts that spawn their ranks").

Knobs:
  --world-size N              processes to spawn (ranks)
  --steps N                   training steps
  --slow-rank R --slow-ms X   rank R sleeps X ms more in every forward (a straggler)
  --base-ms X                 every rank sleeps X ms per forward (device time that does not use the host's CPU)
  --fail-rank R --fail-step S rank R raises at step S (the job fails as torch reports it)
  --start-method M            spawn (mp.spawn, the tutorial's) or fork (mp.start_processes)
  --port P                    MASTER_PORT (the tutorial sets MASTER_ADDR and MASTER_PORT in the script)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)
        self.sleep_s = sleep_s

    def forward(self, x):
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        return self.net2(self.relu(self.net1(x)))


def setup(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank: int, world_size: int, args: argparse.Namespace) -> None:
    setup(rank, world_size, args.port)
    torch.set_num_threads(1)
    sleep_ms = args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)
    ddp_model = DDP(ToyModel(sleep_ms / 1e3))
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"rank {rank} failed at step {step} (--fail-rank)")
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    dist.destroy_process_group()
    if rank == 0:
        print(f"ddp_spawn: {args.steps} steps on {world_size} rank(s)", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--base-ms", type=float, default=10.0)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=0)
    p.add_argument("--start-method", choices=("spawn", "fork"), default="spawn")
    p.add_argument("--port", type=int, default=12355)
    return p.parse_args()


if __name__ == "__main__":
    args = parse_args()
    if args.start_method == "spawn":
        mp.spawn(demo_basic, args=(args.world_size, args), nprocs=args.world_size, join=True)
    else:
        mp.start_processes(demo_basic, args=(args.world_size, args), nprocs=args.world_size, start_method="fork")
