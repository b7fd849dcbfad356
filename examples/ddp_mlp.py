"""A small DDP training job to profile: the seed's MLP on random data, gloo on CPU or NCCL on CUDA.

    torchrun --standalone --nproc_per_node=2 -m distprof.launch examples/ddp_mlp.py --steps 12

Knobs that create the situations distprof must diagnose:
  --slow-rank R --slow-ms X   rank R spends X ms extra every step before backward (a straggler)
  --base-ms X                 every rank sleeps X ms per step before backward: stands in for accelerator work that
                              does not use the host's CPU (tests on a loaded CPU-only machine)
  --uneven                    the last rank gets a 1.5x larger batch (compute/FLOPs imbalance)
  --short-rank R --short-steps N
                              rank R runs out of batches N steps before the others (uneven inputs): the loop runs
                              under DDP's Join context manager, which shadows the others' collectives meanwhile
  --zero                      ZeroRedundancyOptimizer instead of Adam (its states sharded over the ranks; a joinable
                              under Join too)
  --busy-procs N              each rank starts N CPU-bound processes beside it (a noisy neighbour: the host's cores
                              oversubscribed, the ranks waiting for a CPU)
  --bucket-mb MB              DDP gradient bucket size (small buckets overlap communication with backward)
  --hidden H                  hidden width (default 2048, the seed's; tests use a small width so compute stays
                              well below injected delays)
  --compile MODE              torch.compile the model: `model` (torch.compile(model), an OptimizedModule around it)
                              or `inplace` (model.compile(): its own forward call compiled, hooks included)
  --compile-optimizer         compile the optimizer step too (PyTorch's recipe: a torch.compile'd function that calls
                              opt.step())
  --compile-backend NAME      torch.compile's backend (default inductor; `eager` traces with Dynamo and compiles
                              nothing, for quick tests)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="training iterations")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    p.add_argument("--hidden", type=int, default=2048, help="hidden width")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps --slow-ms every step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds per step on --slow-rank")
    p.add_argument("--base-ms", type=float, default=0.0, help="milliseconds every rank sleeps per step")
    p.add_argument("--uneven", action="store_true", help="last rank gets a 1.5x larger batch")
    p.add_argument("--short-rank", type=int, default=-1, help="rank that runs out of batches early (Join)")
    p.add_argument("--short-steps", type=int, default=0, help="how many steps early --short-rank runs out")
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (Adam) instead of Adam")
    p.add_argument("--busy-procs", type=int, default=0, help="CPU-bound processes each rank starts beside it")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--compile", choices=("none", "model", "inplace"), default="none", help="torch.compile the model")
    p.add_argument("--compile-optimizer", action="store_true", help="torch.compile the optimizer step")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    # each spins until killed, or until this rank is gone (its parent changes): never left behind by a crash
    spin = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    [0 for _ in range(20000)]"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(max(args.busy_procs, 0))]
    try:
        train(args)
    finally:
        for p in busy:
            p.kill()
            p.wait()


def train(args: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available()
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(nn.Linear(1024, h), nn.ReLU(), nn.Linear(h, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    if world > 1:
        model = DDP(model, bucket_cap_mb=args.bucket_mb)
    if args.compile == "model":
        model = torch.compile(model, backend=args.compile_backend)
    elif args.compile == "inplace":
        model.compile(backend=args.compile_backend)
    if args.zero and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt_step = opt.step
    if args.compile_optimizer:
        @torch.compile(fullgraph=False, backend=args.compile_backend)
        def opt_step():
            opt.step()

    loss_fn = nn.CrossEntropyLoss()
    batch = args.batch
    if args.uneven and rank == world - 1:
        batch = int(batch * 1.5)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 1024, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    steps = args.steps - (args.short_steps if rank == args.short_rank else 0)
    uneven = nullcontext()
    if world > 1 and args.short_rank >= 0:  # PyTorch's recipe for uneven inputs
        from torch.distributed.algorithms.join import Join

        uneven = Join([model, opt] if args.zero else [model])
    t0 = time.perf_counter()
    with uneven:
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = loss_fn(out, y)
            extra_ms = args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)
            if extra_ms > 0:
                time.sleep(extra_ms / 1000.0)
            loss.backward()
            opt_step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(f"ddp_mlp: {args.steps} steps on {world} rank(s) in {elapsed:.2f} s, last loss {loss.item():.4f}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
