"""A 2-stage pipeline-parallel training job (CPU, gloo): plain send/recv or torch.distributed.pipelining's GPipe.

    torchrun --standalone --nproc_per_node=2 examples/pipeline.py --schedule sendrecv
    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof examples/pipeline.py --schedule gpipe

The model (an MLP of `--layers` residual blocks) is cut in two halves; rank 0 holds the first, rank 1 the second and
the loss. Each step splits the batch into `--microbatches` micro-batches:

  --schedule sendrecv   the loop written by hand as in PyTorch's point-to-point examples: rank 0 runs every forward
                        and `dist.send`s each activation, rank 1 `dist.recv`s it, runs its half and the loss, and
                        sends the input gradient back; backwards follow the forwards (GPipe order)
  --schedule gpipe      the pipelining tutorial's way: `PipelineStage` per rank and
                        `ScheduleGPipe(stage, n_microbatches, loss_fn)`; `schedule.step(x)` on the first stage,
                        `schedule.step(target=y)` on the last

Each rank steps its own optimizer. `--slow-rank R --slow-ms X` makes stage R's forward X ms slower per step (spread
over its micro-batches), so the other stage waits on it: a real pipeline straggler.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Delay(nn.Module):
    """Sleeps `ms` per forward: extra work on one stage."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.s = ms / 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.s > 0:
            time.sleep(self.s)
        return x


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedule", choices=("sendrecv", "gpipe"), default="sendrecv")
    p.add_argument("--steps", type=int, default=12, help="training iterations")
    p.add_argument("--batch", type=int, default=32, help="batch size per step (split into micro-batches)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4, help="blocks in the whole model (half per stage)")
    p.add_argument("--slow-rank", type=int, default=-1, help="stage (rank) whose forward is --slow-ms slower per step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    return p.parse_args()


def stage_module(args, stage: int) -> nn.Module:
    """This stage's half of the model (every rank builds the same full model from one seed, then keeps its half)."""
    torch.manual_seed(0)
    blocks = [Block(args.dim) for _ in range(args.layers)]
    half = args.layers // 2
    mine = blocks[:half] if stage == 0 else blocks[half:]
    if stage == 1:
        mine.append(nn.Linear(args.dim, 10))
    if stage == args.slow_rank and args.slow_ms > 0:
        mine.insert(0, Delay(args.slow_ms / args.microbatches))
    return nn.Sequential(*mine)


def step_sendrecv(model: nn.Module, stage: int, x: torch.Tensor, y: torch.Tensor, args) -> torch.Tensor | None:
    """One GPipe-ordered step by hand: all forwards, then all backwards, activations and gradients by send/recv."""
    mbs = x.chunk(args.microbatches)
    targets = y.chunk(args.microbatches)
    loss_fn = nn.CrossEntropyLoss()
    saved, losses = [], []
    for i, mb in enumerate(mbs):
        if stage == 0:
            out = model(mb)
            dist.send(out.detach(), dst=1)
            saved.append(out)
        else:
            act = torch.empty(mb.shape[0], args.dim)
            dist.recv(act, src=0)
            act.requires_grad_(True)
            loss = loss_fn(model(act), targets[i]) / args.microbatches
            saved.append((act, loss))
            losses.append(loss.detach())
    for i in reversed(range(len(mbs))):
        if stage == 0:
            grad = torch.empty_like(saved[i])
            dist.recv(grad, src=1)
            saved[i].backward(grad)
        else:
            act, loss = saved[i]
            loss.backward()
            dist.send(act.grad, dst=0)
    return torch.stack(losses).sum() if losses else None


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    stage, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("pipeline.py runs on exactly 2 ranks (2 stages)")
    model = stage_module(args, stage)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.dim, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    schedule = None
    if args.schedule == "gpipe":
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        pipe_stage = PipelineStage(model, stage_index=stage, num_stages=2, device=torch.device("cpu"))
        loss_fn = nn.CrossEntropyLoss()
        schedule = ScheduleGPipe(pipe_stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    t0 = time.perf_counter()
    loss = None
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        if schedule is None:
            loss = step_sendrecv(model, stage, x, y, args)
        elif stage == 0:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            loss = torch.stack(losses).mean()
        opt.step()
    elapsed = time.perf_counter() - t0
    if stage == 1:
        print(f"pipeline ({args.schedule}): {args.steps} steps on 2 stages in {elapsed:.2f} s, "
              f"last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
