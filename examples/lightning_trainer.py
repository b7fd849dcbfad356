"""A Lightning `Trainer` run, unchanged under distprof: a tiny MLP LightningModule (random weights) on synthetic
data, with strategy DDP or FSDP.

    torchrun --standalone --nproc_per_node=2 -m distprof.launch examples/lightning_trainer.py --strategy ddp

Lightning reads torchrun's variables (devices = --nproc_per_node), makes the process group (gloo on CPU) and wraps
the model; distprof's optimizer-step hook sees each optimizer step (docs/frameworks.md).

Knobs:
  --strategy {ddp,fsdp}       Lightning's DDPStrategy or FSDPStrategy
  --slow-rank R --slow-ms X   rank R sleeps X ms at the start of every forward (stands in for slower device work)
  --base-ms X                 every rank sleeps X ms per forward (device time that does not use the host's CPU)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps (max_steps)")
    p.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    p.add_argument("--hidden", type=int, default=128, help="hidden width")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps --slow-ms every forward")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds per forward on --slow-rank")
    p.add_argument("--base-ms", type=float, default=0.0, help="milliseconds every rank sleeps per forward")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    sleep_s = (args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1e3

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            h = args.hidden
            self.net = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if sleep_s > 0:
                time.sleep(sleep_s)
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(rank)
    n = args.steps * args.batch * world
    data = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)
    cpu = not torch.cuda.is_available()
    strategy = (DDPStrategy(process_group_backend="gloo" if cpu else None) if args.strategy == "ddp" else
                FSDPStrategy(process_group_backend="gloo" if cpu else None))
    trainer = L.Trainer(accelerator="cpu" if cpu else "gpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                        num_nodes=max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", 1))), strategy=strategy,
                        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    trainer.fit(MLP(), loader)
    if rank == 0:
        print(f"lightning_trainer: {args.strategy}, {trainer.global_step} steps on {world} rank(s) in "
              f"{time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
