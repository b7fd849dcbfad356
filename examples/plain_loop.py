"""A loop without an optimizer, profiled with the explicit API (no launcher needed).

    python examples/plain_loop.py --out prof --steps 10
    torchrun --standalone --nproc_per_node=2 examples/plain_loop.py --out prof

Each iteration does a matmul-heavy "inference" step and, with several ranks, an all_reduce of a result.
`p.step()` marks the end of an iteration; inside a script run by `distprof.launch --step-on manual`,
`distprof.step()` does the same.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import distprof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="distprof-runs")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    w = torch.randn(args.size, args.size)
    x = torch.randn(64, args.size)
    with distprof.profile(out=args.out, wait=1, warmup=1, active=3) as p:
        for _ in range(args.steps):
            y = torch.relu(x @ w) @ w.T
            if world > 1:
                dist.all_reduce(y)
            x = y / (y.norm() + 1e-6)
            p.step()
    if p.run_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"plain_loop: shards in {p.run_dir}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
