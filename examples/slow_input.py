"""A small training loop starved by its input pipeline, with user annotations (CPU, gloo).

    python -m distprof.launch --out prof examples/slow_input.py
    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof examples/slow_input.py --steps 8

The dataset's ``__getitem__`` sleeps ``--item-ms`` per sample and the DataLoader runs in the main process
(``--workers 0``), so every step waits ``batch × item-ms`` for its batch: ``distprof report`` shows an
``input_wait`` finding. ``--workers N`` loads in N worker processes instead (the wait shrinks). The forward,
loss and backward are marked with ``torch.profiler.record_function`` ("forward", "loss", "backward"), so they appear
in the report's ``annotations`` for every rank.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    """Random samples that take `item_ms` each to "load"."""

    def __init__(self, n: int, dim: int, item_ms: float):
        self.n, self.dim, self.item_s = n, dim, item_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.item_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), torch.randn(1, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="training iterations")
    ap.add_argument("--batch", type=int, default=8, help="per-rank batch size")
    ap.add_argument("--dim", type=int, default=64, help="input width")
    ap.add_argument("--item-ms", type=float, default=2.0, help="milliseconds to load one sample")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(args.dim, 128), nn.ReLU(), nn.Linear(128, 1))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = DataLoader(SlowDataset(args.steps * args.batch, args.dim, args.item_ms), batch_size=args.batch,
                      num_workers=args.workers)
    for x, y in data:
        with record_function("forward"):
            out = model(x)
        with record_function("loss"):
            loss = nn.functional.mse_loss(out, y)
        with record_function("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
