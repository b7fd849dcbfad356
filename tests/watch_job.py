"""Small jobs of every synchronisation style for the watch tests (torchrun + distprof.launch --watch).

    torchrun --nproc_per_node=2 -m distprof.launch --watch --schedule none tests/watch_job.py \
        --style ddp --steps 200 --slow-rank 1 --slow-from 60 --slow-ms 30

Every step sleeps --sleep-ms on every rank (device-like time that leaves the CPU to the others on a loaded machine);
from step --slow-from on (until --slow-until, and again in --slow-again A:B), --slow-rank sleeps --slow-ms more, at
--where in the iteration (its own work). The styles, each synchronising the ranks its own way:

  explicit   gradients averaged by hand: one synchronous ``dist.all_reduce`` of the flattened gradients per step
  ddp        ``DistributedDataParallel`` (the reducer all-reduces gradient buckets from C++ during backward);
             --bucket-mb sets ``bucket_cap_mb`` (a tiny value: a bucket per parameter)
  fsdp2      examples/fsdp2.py's transformer, ``fully_shard`` per block and the root (all-gathers, reduce-scatters)
  mesh2d     examples/mesh2d.py's model on a (dp x tp) mesh: tensor-parallel all-reduces (functional collectives)
             inside each block, FSDP2 over dp; 4 ranks
  pipeline   examples/pipeline.py's two stages, the hand-written send/recv loop (2 ranks)
  gpipe      examples/pipeline.py's two stages under torch.distributed.pipelining's ScheduleGPipe (2 ranks)

In fsdp2, mesh2d, pipeline and gpipe the sleeps sit in the example's own delay (its forward), --where is ignored.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STYLES = ("explicit", "ddp", "fsdp2", "mesh2d", "pipeline", "gpipe")
WHERE = ("before-forward", "before-backward", "after-backward")


def example(name: str):
    """examples/<name>.py as a module (its models and loops; its main() is not run)."""
    spec = importlib.util.spec_from_file_location(f"distprof_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--style", choices=STYLES, default="explicit")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep-ms", type=float, default=20.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=60)
    p.add_argument("--slow-until", type=int, default=1 << 30, help="the slow rank is slow in [from, until) ...")
    p.add_argument("--slow-again", type=str, default="", help="... and again in A:B")
    p.add_argument("--slow-ms", type=float, default=30.0)
    p.add_argument("--where", choices=WHERE, default="before-backward", help="where the sleeps sit (explicit, ddp)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="ddp: bucket_cap_mb")
    return p.parse_args()


class Pacer:
    """Seconds to sleep in step `step` on this rank: the base, plus the slow rank's extra in its slow spans."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        self.again = tuple(int(v) for v in args.slow_again.split(":")) if args.slow_again else (-1, -1)

    def seconds(self, step: int) -> float:
        a = self.args
        slow = self.rank == a.slow_rank and (a.slow_from <= step < a.slow_until
                                             or self.again[0] <= step < self.again[1])
        return (a.sleep_ms + (a.slow_ms if slow else 0.0)) / 1000.0


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def run_flat(args: argparse.Namespace, pacer: Pacer, ddp: bool) -> None:
    """explicit and ddp: the MLP, the sleep at --where; gradients by one all_reduce (explicit) or DDP's reducer."""
    world = dist.get_world_size()
    model = mlp()
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        s = pacer.seconds(step)
        opt.zero_grad(set_to_none=True)
        if args.where == "before-forward":
            time.sleep(s)
        loss = loss_fn(model(x), y)
        if args.where == "before-backward":
            time.sleep(s)
        loss.backward()
        if args.where == "after-backward":
            time.sleep(s)
        if not ddp:
            params = list(model.parameters())
            flat = torch.cat([q.grad.reshape(-1) for q in params])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for q in params:
                q.grad.copy_(flat[off:off + q.numel()].view_as(q))
                off += q.numel()
        opt.step()


def run_fsdp2(args: argparse.Namespace, pacer: Pacer, mesh2d: bool) -> None:
    """fsdp2 / mesh2d: the example's model, its forward's own delay set to this step's sleep."""
    if mesh2d:
        ex = example("mesh2d")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = ex.Model(32, 64, 2, 0.0)
        for layer in model.layers:
            parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        gen = torch.Generator().manual_seed(mesh.get_local_rank("dp"))
        x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        target = y
    else:
        ex = example("fsdp2")
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = ex.Transformer(64, 32, 2, 2, 0.0)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        gen = torch.Generator().manual_seed(dist.get_rank())
        tokens = torch.randint(0, 64, (4, 9), generator=gen)
        x, target = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        model.slow_s = pacer.seconds(step)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), target).backward()
        opt.step()


def run_pipeline(args: argparse.Namespace, pacer: Pacer, gpipe: bool) -> None:
    """pipeline / gpipe: the example's two stages, each with a Delay module in front set to this step's sleep."""
    ex = example("pipeline")
    stage = dist.get_rank()
    micro = 2
    cfg = argparse.Namespace(dim=32, layers=2, microbatches=micro, slow_rank=stage, slow_ms=1.0)
    model = ex.stage_module(cfg, stage)  # a Delay first on this stage (slow_rank = this stage)
    delay = model[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    schedule = None
    if gpipe:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        pipe_stage = PipelineStage(model, stage_index=stage, num_stages=2, device=torch.device("cpu"))
        schedule = ScheduleGPipe(pipe_stage, n_microbatches=micro, loss_fn=nn.CrossEntropyLoss())
    for step in range(args.steps):
        delay.s = pacer.seconds(step) / micro  # per micro-batch
        opt.zero_grad(set_to_none=True)
        if schedule is None:
            ex.step_sendrecv(model, stage, x, y, cfg)
        elif stage == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    pacer = Pacer(args, dist.get_rank())
    if args.style in ("explicit", "ddp"):
        run_flat(args, pacer, ddp=args.style == "ddp")
    elif args.style in ("fsdp2", "mesh2d"):
        run_fsdp2(args, pacer, mesh2d=args.style == "mesh2d")
    else:
        run_pipeline(args, pacer, gpipe=args.style == "gpipe")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
