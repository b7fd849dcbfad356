"""The training loop: DDP on gloo (CPU) or NCCL (CUDA) when started by a launcher, one process otherwise.

Knobs: --steps N, --hidden H, --slow-rank R --slow-ms X (rank R sleeps X ms at the start of every forward: slower
device work), --base-ms X (every rank sleeps X ms per forward), --exit-code C (exit with C after training).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .model import batch, build_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pkgtrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--base-ms", type=float, default=0.0)
    p.add_argument("--exit-code", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if rank == 0:  # what python -m makes of a module: the proof the tests read
        print(f"pkgtrain: __name__={__name__} __package__={__package__} argv={sys.argv}", flush=True)
    torch.manual_seed(0)
    model = build_model(args.hidden)
    sleep_s = (args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1e3
    if sleep_s > 0:
        model.register_forward_pre_hook(lambda module, inputs: time.sleep(sleep_s))
    if distributed:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch(rank, 16)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if rank == 0:
        print(f"pkgtrain: {args.steps} steps on {world} rank(s) in {time.perf_counter() - t0:.2f} s")
    if distributed:
        dist.destroy_process_group()
    if args.exit_code:
        sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
