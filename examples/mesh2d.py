"""2-D parallel training (CPU, gloo): tensor parallel inside a DeviceMesh row, FSDP2 data parallel across rows.

    torchrun --standalone --nproc_per_node=4 examples/mesh2d.py
    torchrun --standalone --nproc_per_node=4 -m distprof.launch --out prof examples/mesh2d.py --slow-rank 1 --slow-ms 30

Written the way PyTorch's tensor-parallel tutorial combines TP with FSDP: `init_device_mesh("cpu", (dp, tp),
mesh_dim_names=("dp", "tp"))` initialises the default process group (no backend named) and makes the groups
`mesh_dp` and `mesh_tp`; each feed-forward block is split with
`parallelize_module` (`ColwiseParallel` for the up projection, `RowwiseParallel` for the down projection, so each
block ends in an all-reduce over `tp`), and `fully_shard(..., mesh=mesh["dp"])` shards parameters over `dp`
(all-gathers before forward/backward, reduce-scatters of gradients).

`--slow-rank R --slow-ms X` makes rank R's forward X ms slower per step: its TP peer waits at every block's
all-reduce and the other DP row at the gradient reduce-scatter.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int, slow_s: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FeedForward(dim, hidden) for _ in range(layers))
        self.head = nn.Linear(dim, 10)
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_s > 0:
            time.sleep(self.slow_s)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="training iterations")
    p.add_argument("--dp", type=int, default=2, help="data-parallel size (the mesh is dp x world/dp)")
    p.add_argument("--batch", type=int, default=16, help="per-DP-rank batch size")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--slow-rank", type=int, default=-1, help="rank whose forward is --slow-ms slower per step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world % args.dp:
        raise SystemExit(f"mesh2d.py: world size {world} is not a multiple of --dp {args.dp}")
    # as in the tutorial, the mesh makes the default process group too (init_process_group() without a backend)
    mesh = init_device_mesh("cpu", (args.dp, world // args.dp), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0
    model = Model(args.dim, args.hidden, args.layers, slow_s)
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # every rank of a TP group sees the same batch; DP rows see different ones
    gen = torch.Generator().manual_seed(mesh.get_local_rank("dp"))
    x = torch.randn(args.batch, args.dim, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(f"mesh2d: {args.steps} steps on a {args.dp}x{world // args.dp} (dp x tp) mesh in {elapsed:.2f} s, "
              f"last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
