"""Tiny training job for tests/gpu/check_gpu.py: an MLP with SGD, DDP when run under torchrun.

    python train_small.py STEPS BACKEND DEVICE        BACKEND: nccl | gloo | none, DEVICE: cuda | cpu

Every rank uses cuda:0 (two ranks share one GPU in the check). A rank-1 extra matmul makes the ranks' work differ.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main() -> None:
    steps, backend, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1:
        kw = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60), **kw)
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 512, generator=gen).to(dev)
    y = torch.randint(0, 10, (64,), generator=gen).to(dev)
    extra = torch.randn(256, 256, device=dev)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        if rank == 1:
            loss = loss + (extra @ extra).mean() * 0.0
        loss.backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
