"""DeepSpeed ZeRO training, unchanged under distprof: a tiny MLP built here (random weights), synthetic data.

    torchrun --standalone --nproc_per_node=2 -m distprof.launch examples/deepspeed_zero.py --stage 2 --steps 12

Runs on CPU with gloo (DeepSpeed's CPU accelerator; no op is compiled) or on GPUs with NCCL. The optimizer is a
torch one handed to deepspeed.initialize, so distprof's optimizer-step hook sees every step (docs/frameworks.md).

Knobs:
  --stage {1,2,3}             ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters
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
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    p.add_argument("--steps", type=int, default=12, help="training iterations")
    p.add_argument("--batch", type=int, default=8, help="micro-batch per rank")
    p.add_argument("--hidden", type=int, default=128, help="hidden width")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps --slow-ms every forward")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds per forward on --slow-rank")
    p.add_argument("--base-ms", type=float, default=0.0, help="milliseconds every rank sleeps per forward")
    return p.parse_args()


def ds_config(args: argparse.Namespace) -> dict:
    """Small buckets, so that even this tiny model's gradients take several reduce calls."""
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,  # a torch optimizer, not DeepSpeed's compiled ones
        "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 20_000, "allgather_bucket_size": 20_000,
                              "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
    }


def main() -> None:
    args = parse_args()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    sleep_s = (args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1e3
    if sleep_s > 0:
        model.register_forward_pre_hook(lambda module, inputs: time.sleep(sleep_s))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 64, generator=gen).to(engine.device)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(engine.device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    if rank == 0:
        print(f"deepspeed_zero: ZeRO-{args.stage}, {args.steps} steps on {world} rank(s) in "
              f"{time.perf_counter() - t0:.2f} s, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
