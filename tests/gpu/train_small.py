"""Tiny training job for tests/gpu/check_gpu.py: an MLP with SGD, DDP when run under torchrun.

    python train_small.py STEPS BACKEND DEVICE [DELAY_MS]   BACKEND: nccl | gloo | none, DEVICE: cuda | cpu

Every rank uses cuda:0 (two ranks share one GPU in the check). A rank-1 extra matmul makes the ranks' work differ
(not in the delay jobs).
With DELAY_MS (0 included) every step is shaped like a data-loading training loop: 5 ms of host work on every rank
(a sleep), rank 1 sleeping DELAY_MS more before its forward pass, and the loss read back (`.item()`, as a logging loop
does), so each step's collectives are where the ranks meet.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected": it keys a GPU by host and bus id). Where the ranks
outnumber the GPUs, each rank gets its own NCCL_HOSTID, so NCCL takes the ranks for separate hosts and connects
them over sockets on the loopback interface: a real 2-rank NCCL job on one GPU (its collectives are network-speed).
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main() -> None:
    steps, backend, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    delay_s = float(sys.argv[4]) / 1e3 if len(sys.argv) > 4 else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "nccl":
        share_gpu(world)
    if world > 1:
        kw = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60), **kw)
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    # the delay jobs on CPU: a small model, so that the sleeps (not two ranks' arithmetic on shared cores) make the step
    d, h = (32, 64) if delay_s is not None and dev.type == "cpu" else (512, 1024)
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d), nn.ReLU(), nn.Linear(d, 10)).to(dev)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, d, generator=gen).to(dev)
    y = torch.randint(0, 10, (64,), generator=gen).to(dev)
    extra = torch.randn(256, 256, device=dev)
    for _ in range(steps):
        if delay_s is not None:
            time.sleep(0.005 + (delay_s if rank == 1 else 0.0))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        if rank == 1 and delay_s is None:  # the delay jobs: the ranks differ by the delay alone
            loss = loss + (extra @ extra).mean() * 0.0
        loss.backward()
        opt.step()
        if delay_s is not None:
            loss.item()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def share_gpu(world: int) -> None:
    """Let NCCL run more ranks than GPUs: a host id of its own per rank (before the process group is made)."""
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        os.environ["NCCL_HOSTID"] = f"distprof-gpu-check-{os.environ.get('LOCAL_RANK', '0')}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")


if __name__ == "__main__":
    main()
