"""A training job that runs until told to stop, for the trigger tests (run under torchrun + distprof.launch).

    torchrun --nproc_per_node=2 -m distprof.launch --schedule none tests/trigger_job.py --stop FILE [--mode pipeline]

Rank 0 decides when to stop (FILE exists, or --max-s passed) and tells the others in the job's own traffic, so every
rank stops after the same step:

  --mode ddp       a small DDP MLP; the stop flag is all-reduced each step
  --mode pipeline  examples/pipeline.py's 2-stage send/recv step (stage 1 waits in recv for stage 0); the flag is sent
                   from stage 0 to stage 1 ahead of each step's activations

Each step sleeps --sleep-ms on every rank (a paced job that leaves the CPU to the others on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--stop", required=True, help="stop once this file exists")
    p.add_argument("--mode", choices=("ddp", "pipeline"), default="ddp")
    p.add_argument("--sleep-ms", type=float, default=20.0)
    p.add_argument("--max-s", type=float, default=90.0, help="stop after this long whatever happens")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t0 = time.monotonic()
    flag = torch.zeros(1)
    steps = 0
    if args.mode == "ddp":
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
        loss_fn = nn.CrossEntropyLoss()
        while True:
            flag[0] = float(rank == 0 and (os.path.exists(args.stop) or time.monotonic() - t0 > args.max_s))
            dist.all_reduce(flag)
            if flag[0] > 0:
                break
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            time.sleep(args.sleep_ms / 1000)
            opt.step()
            steps += 1
    else:
        import pipeline  # examples/pipeline.py

        pargs = argparse.Namespace(microbatches=4, dim=32, layers=2, slow_rank=-1, slow_ms=0.0)
        model = pipeline.stage_module(pargs, rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        while True:
            if rank == 0:
                flag[0] = float(os.path.exists(args.stop) or time.monotonic() - t0 > args.max_s)
                dist.send(flag, dst=1)
            else:
                dist.recv(flag, src=0)
            if flag[0] > 0:
                break
            opt.zero_grad(set_to_none=True)
            pipeline.step_sendrecv(model, rank, x, y, pargs)
            time.sleep(args.sleep_ms / 1000)
            opt.step()
            steps += 1
    print(f"trigger_job: rank {rank} ran {steps} steps in {time.monotonic() - t0:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
