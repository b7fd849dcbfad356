"""An accelerator-like training job with a delay placed anywhere in the iteration (benchmarks/whatif_accuracy.py,
tests/test_whatif.py).

    torchrun --standalone --nproc_per_node=2 -m distprof.launch --out prof benchmarks/_whatif_job.py \
        --job ddp --place pre --delay-ms 20 --slow-rank 1

Every rank's "device time" is a sleep (``--device-ms`` per iteration: a third in the forward, two thirds in the
backward, inside the model as an autograd function, so it sits where a GPU's kernels would and does not compete for
the host's cores); the model is tiny, so the CPU work is small beside it. ``--place`` puts ``--delay-ms`` of extra
time on ``--slow-rank``:

* ``pre`` — before the forward, while the iteration fetches its batch (a DataLoader wait);
* ``mid`` — between the forward and the backward;
* ``opt`` — in the optimizer (a step pre-hook: after the backward and its gradient communication);
* ``callback`` — in an ``on_step_begin`` callback, before the batch is fetched;
* ``some`` — before the forward, in every ``--every``-th iteration only.

``--delay-cycle N`` keeps the delay to every other block of N iterations: under a profiler schedule of cycle N
(wait + warmup + active), windows with and without the delay alternate within one job.

``--job``: ``ddp`` (DistributedDataParallel, a plain loop), ``fsdp2`` (``fully_shard`` per block and the root, a
plain loop), ``loop`` (DDP in a framework-style loop, as Hugging Face's ``Trainer`` writes it: callbacks at step begin
and end, a DataLoader, gradient clipping, an LR scheduler, a loss all-reduce for logging every ``--log-every``
iterations after the optimizer step).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

PLACES = ("pre", "mid", "opt", "callback", "some")
JOBS = ("ddp", "fsdp2", "loop")


class Device(torch.autograd.Function):
    """Identity whose forward and backward sleep: a device's kernels, as far as the host's time goes."""

    @staticmethod
    def forward(ctx, x, fwd_s: float, bwd_s: float):
        ctx.bwd_s = bwd_s
        if fwd_s > 0:
            time.sleep(fwd_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.bwd_s > 0:
            time.sleep(ctx.bwd_s)
        return g, None, None


class Block(nn.Module):
    def __init__(self, dim: int, fwd_s: float, bwd_s: float) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.fwd_s, self.bwd_s = fwd_s, bwd_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(Device.apply(self.lin(x), self.fwd_s, self.bwd_s))  # the backward sleeps before lin's


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", choices=JOBS, default="ddp")
    p.add_argument("--place", choices=PLACES, default="pre")
    p.add_argument("--delay-ms", type=float, default=0.0, help="extra ms on --slow-rank (0: the re-run)")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--every", type=int, default=3, help="--place some: the delay in every N-th iteration")
    p.add_argument("--delay-cycle", type=int, default=0,
                   help="the delay only in iterations whose (iteration // N) is even (0: in all): with a profiler "
                        "schedule whose cycle is N iterations, windows with and without the delay alternate")
    p.add_argument("--device-ms", type=float, default=40.0, help="ms every rank sleeps per iteration")
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DDP bucket_cap_mb (small, with --dim 256: a bucket per block, several all-reduces per step)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--log-every", type=int, default=2, help="--job loop: loss all-reduce every N iterations")
    p.add_argument("--sessions", default="",
                   help="run the job once per comma-separated RUN_ID, each under its own distprof.profile (step on "
                        "the optimizer, as the launcher does) into --out; a RUN_ID ending in '-d' has the delay, the "
                        "others none (pairs of runs in the same processes, without a launch per run)")
    p.add_argument("--out", default="", help="--sessions: the runs' directory")
    p.add_argument("--schedule", default="1,1,6", help="--sessions: WAIT,WARMUP,ACTIVE")
    return p.parse_args()


def build(args: argparse.Namespace, rank: int):
    torch.manual_seed(0)
    per = args.device_ms / 1000.0 / args.blocks
    blocks = [Block(args.dim, per / 3, 2 * per / 3) for _ in range(args.blocks)]
    model = nn.Sequential(*blocks, nn.Linear(args.dim, 10))
    if args.job == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for b in blocks:
            fully_shard(b)
        fully_shard(model)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


class Delay:
    """The slow rank's extra time at one place of the iteration (nothing on the other ranks)."""

    def __init__(self, args: argparse.Namespace, rank: int, delay_ms: float) -> None:
        self.s = delay_ms / 1000.0 if rank == args.slow_rank else 0.0
        self.place, self.every, self.cycle = args.place, max(args.every, 1), max(args.delay_cycle, 0)
        self.it = 0

    def at(self, place: str) -> None:
        if self.s <= 0 or (self.cycle and (self.it // self.cycle) % 2):
            return
        if place == self.place or (place == "pre" and self.place == "some" and self.it % self.every == 0):
            time.sleep(self.s)

    def install(self, opt: torch.optim.Optimizer) -> None:
        opt.register_step_pre_hook(lambda *_: self.at("opt"))


def plain_loop(args, model, opt, delay: Delay, x, y) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for it in range(args.steps):
        delay.it = it
        delay.at("callback")  # a step-begin hook of the loop
        delay.at("pre")  # the batch fetch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        delay.at("mid")
        loss.backward()
        opt.step()


class Callback:
    def on_step_begin(self, state: dict) -> None:
        pass

    def on_step_end(self, state: dict) -> None:
        pass


class DelayCallback(Callback):
    def __init__(self, delay: Delay) -> None:
        self.delay = delay

    def on_step_begin(self, state: dict) -> None:
        self.delay.it = state["it"]
        self.delay.at("callback")


class Trainer:
    """The shape of a framework's training loop (Hugging Face Trainer's inner loop, much reduced)."""

    def __init__(self, args, model, opt, delay: Delay, x, y) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        self.args, self.model, self.opt, self.delay = args, model, opt, delay
        self.loader = DataLoader(TensorDataset(x.repeat(4, 1), y.repeat(4)), batch_size=x.shape[0], shuffle=False)
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.01 * s))
        self.callbacks: list[Callback] = [Callback(), DelayCallback(delay)]
        self.loss_fn = nn.CrossEntropyLoss()

    def batches(self):
        while True:
            for b in self.loader:
                self.delay.at("pre")  # the DataLoader's wait
                yield b

    def train(self) -> None:
        state = {"it": 0, "loss": torch.zeros(())}
        data = self.batches()
        for it in range(self.args.steps):
            state["it"] = it
            for cb in self.callbacks:
                cb.on_step_begin(state)
            xb, yb = next(data)
            self.model.train()
            loss = self.loss_fn(self.model(xb), yb)
            self.delay.at("mid")
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            state["loss"] = state["loss"] + loss.detach()
            if (it + 1) % max(self.args.log_every, 1) == 0:  # _maybe_log_save_evaluate: the mean loss over ranks
                dist.all_reduce(state["loss"])
                state["loss"].zero_()
            for cb in self.callbacks:
                cb.on_step_end(state)


def run_once(args: argparse.Namespace, rank: int, delay_ms: float) -> float:
    """One training run (a fresh model and optimizer); its wall time (s)."""
    model, opt = build(args, rank)
    delay = Delay(args, rank, delay_ms)
    delay.install(opt)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.dim, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    t0 = time.perf_counter()
    if args.job == "loop":
        Trainer(args, model, opt, delay, x, y).train()
    else:
        plain_loop(args, model, opt, delay, x, y)
    return time.perf_counter() - t0


def sessions(args: argparse.Namespace, rank: int) -> None:
    import distprof

    wait, warmup, active = (int(v) for v in args.schedule.split(","))
    for run_id in args.sessions.split(","):
        dist.barrier()
        with distprof.profile(out=args.out, run_id=run_id, step_on="optimizer", wait=wait, warmup=warmup,
                              active=active):
            run_once(args, rank, args.delay_ms if run_id.endswith("-d") else 0.0)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.sessions:
        sessions(args, rank)
    else:
        s = run_once(args, rank, args.delay_ms)
        if rank == 0:
            print(f"whatif job {args.job}: {args.steps} iterations in {s:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
