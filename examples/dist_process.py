"""Distributed SGD as PyTorch's "Writing Distributed Applications" tutorial writes it: the script starts one
``multiprocessing.Process`` per rank, each runs ``init_process`` (making its process group with an explicit rank)
and then ``run``, which averages the gradients itself with ``dist.all_reduce`` — no torchrun, no DDP.

    python -m distprof.launch examples/dist_process.py --world-size 2

distprof's launcher is then no rank: each started process that makes a process group is profiled as one, into one
run directory (docs/capture.md, "Scripts that start their ranks").

Knobs:
  --world-size N              processes to start (ranks)
  --steps N                   training steps
  --slow-rank R --slow-ms X   rank R sleeps X ms more in every step (a straggler)
  --base-ms X                 every rank sleeps X ms per step (device time that does not use the host's CPU)
  --start-method M            spawn (the tutorial's) or fork
  --helper                    also start a helper process that makes no process group (it is not profiled)
  --subclass                  each rank a ``Process`` subclass whose ``run()`` does the work (older scripts' style)
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


def average_gradients(model: nn.Module) -> None:
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank: int, size: int, args: argparse.Namespace) -> None:
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    sleep_s = (args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1e3
    for _ in range(args.steps):
        data, target = torch.randn(16, 32), torch.randint(0, 10, (16,))
        optimizer.zero_grad()
        time.sleep(sleep_s)
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        average_gradients(model)
        optimizer.step()
    if rank == 0:
        print(f"dist_process: {args.steps} steps on {size} rank(s)", flush=True)


def init_process(rank: int, size: int, fn, args: argparse.Namespace, backend: str = "gloo") -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size, args)
    dist.destroy_process_group()


class RankProcess(mp.Process):
    """A rank as a ``Process`` subclass: its ``run()`` makes the group and trains."""

    def __init__(self, rank: int, size: int, args: argparse.Namespace) -> None:
        super().__init__()
        self.rank, self.size, self.args = rank, size, args

    def run(self) -> None:
        init_process(self.rank, self.size, run, self.args)


def helper(seconds: float) -> None:
    """A process that is no rank (a data producer, a logger): it makes no process group."""
    time.sleep(seconds)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--base-ms", type=float, default=10.0)
    p.add_argument("--start-method", choices=("spawn", "fork"), default="spawn")
    p.add_argument("--helper", action="store_true")
    p.add_argument("--subclass", action="store_true")
    p.add_argument("--port", type=int, default=29500)
    return p.parse_args()


if __name__ == "__main__":
    args = parse_args()
    mp.set_start_method(args.start_method)
    processes = []
    if args.helper:
        processes.append(mp.Process(target=helper, args=(0.5,)))
        processes[-1].start()
    for rank in range(args.world_size):
        if args.subclass:
            p = RankProcess(rank, args.world_size, args)
        else:
            p = mp.Process(target=init_process, args=(rank, args.world_size, run, args))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    raise SystemExit(max(p.exitcode or 0 for p in processes))
