"""An accelerator-like training job for benchmarks/straggler_rates.py: every rank's "device time" is a sleep (it does
not use the host's CPU), the model is tiny, and one rank can be made slower at a chosen place of the iteration.

    torchrun --standalone --nproc_per_node=2 -m distprof.launch ... _straggler_job.py --style ddp --steps 14 \
        --device-ms 40 [--slow-rank 1 --slow-ms 4]

Styles (where the delay sits follows where each style's real-world delays sit):

* ``ddp`` — an MLP in DDP with small buckets (several bucket all-reduces per step); the device time and the delay
  sit between forward and backward.
* ``fsdp2`` — a stack of blocks under ``fully_shard`` (an all-gather per block in forward and backward, a
  reduce-scatter per block); the device time is spread over the blocks' forwards, the delay at the start of forward.
* ``callbacks`` — a framework-style loop (a Trainer with ``on_step_begin`` / ``on_step_end`` callbacks, batches from
  an iterator, the model in DDP); the delay is an ``on_step_begin`` callback, before the forward — where DataLoader
  waits and host-side preprocessing sit.

``--sleep-log PREFIX`` writes, step by step, to ``PREFIX.rank<N>.json``: ``slept_ms``, the rank's time in its sleeps
(the slow rank's minus the others' is the delay it really took: ``time.sleep`` overshoots by the host's timer slack
and wake-up latency), and ``sync_ns``, when (``time.monotonic_ns``, one clock for every process of a host) it
reached the step's first synchronisation — done with what comes before the first collective: the slow rank's
minus the others' is how late it really was, measured by the job itself, without the profiler.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--style", choices=("ddp", "fsdp2", "callbacks"), default="ddp")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--device-ms", type=float, default=40.0, help="ms every rank sleeps per step (device time)")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=_delays, default=[0.0],
                   help="extra ms per step on --slow-rank; a comma-separated list is cycled step by step")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--sleep-log", metavar="PREFIX", help="write this rank's time asleep and when it reached the first collective, per step, "
                                                     "to PREFIX.rank<N>.json")
    return p.parse_args()


def _delays(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


class Delays:
    """The slow rank's delay, step by step (a list cycled); 0 on the other ranks."""

    def __init__(self, args, rank: int) -> None:
        self.ms = args.slow_ms if rank == args.slow_rank else [0.0]
        self.i = 0

    def next(self) -> float:
        self.i += 1
        return self.ms[(self.i - 1) % len(self.ms)]


#: ns this rank has spent in sleep_ms (device time and delays), for --sleep-log.
SLEPT_NS = [0]
#: time.monotonic_ns() when this rank last reached a step's first synchronisation (mark_sync), for --sleep-log.
SYNC_NS = [0]


def mark_sync() -> None:
    """The rank is done with what comes before its step's first collective."""
    SYNC_NS[0] = time.monotonic_ns()


def sleep_ms(ms: float) -> None:
    if ms > 0:
        t = time.perf_counter_ns()
        time.sleep(ms / 1e3)
        SLEPT_NS[0] += time.perf_counter_ns() - t


class Block(nn.Module):
    def __init__(self, dim: int, device_ms: float) -> None:
        super().__init__()
        self.lin = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.device_ms = device_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sleep_ms(self.device_ms)
        return x + self.lin(x)


def ddp_step(args, rank: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(nn.Sequential(*(Block(args.dim, 0.0) for _ in range(4))), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, args.dim)
    delays = Delays(args, rank)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        sleep_ms(args.device_ms + delays.next())  # the device's work (and the slow rank's delay) between forward and backward
        mark_sync()  # the first bucket's all-reduce follows in backward
        loss.backward()
        opt.step()
    return step


def fsdp2_step(args, rank: int):
    from torch.distributed.fsdp import fully_shard

    n = 4
    model = nn.Sequential(*(Block(args.dim, args.device_ms / n) for _ in range(n)))
    for b in model:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, args.dim)
    delays = Delays(args, rank)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        sleep_ms(delays.next())  # the slow rank's delay at the start of forward
        mark_sync()  # the first block's all-gather
        model(x).square().mean().backward()
        opt.step()
    return step


class Trainer:
    """A framework-style loop: callbacks around each step, batches from an iterator."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, batches, callbacks) -> None:
        self.model, self.opt, self.batches, self.callbacks = model, opt, batches, callbacks

    def training_step(self) -> None:
        for cb in self.callbacks:
            cb.on_step_begin(self)
        x = next(self.batches)
        loss = self.model(x).square().mean()  # device time, no collective
        mark_sync()  # the first bucket's all-reduce follows in backward
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for cb in self.callbacks:
            cb.on_step_end(self)


class Delay:
    def __init__(self, delays: Delays) -> None:
        self.delays = delays

    def on_step_begin(self, trainer: Trainer) -> None:
        sleep_ms(self.delays.next())

    def on_step_end(self, trainer: Trainer) -> None:
        pass


def callbacks_step(args, rank: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    n = 4
    model = DDP(nn.Sequential(*(Block(args.dim, args.device_ms / n) for _ in range(n))), bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batches():
        g = torch.Generator().manual_seed(rank)
        while True:
            yield torch.randn(8, args.dim, generator=g)
    trainer = Trainer(model, opt, batches(), [Delay(Delays(args, rank))])
    return trainer.training_step


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    step = {"ddp": ddp_step, "fsdp2": fsdp2_step, "callbacks": callbacks_step}[args.style](args, rank)
    slept, sync = [], []
    for _ in range(args.steps):
        before = SLEPT_NS[0]
        step()
        slept.append((SLEPT_NS[0] - before) / 1e6)
        sync.append(SYNC_NS[0])
    if args.sleep_log:
        with open(f"{args.sleep_log}.rank{rank}.json", "w") as f:
            json.dump({"slept_ms": slept, "sync_ns": sync}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
