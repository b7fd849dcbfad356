"""A small DDP job that injects one fault at an exact step (the capture-fault tests run it under torchrun).

    fault_train.py --steps 12 [--fault KIND --rank R --at STEP [--where mid|boundary] [--seconds S]]

``--slow-rank R --slow-ms X``: rank R is X ms slower every step (a real straggler); ``--times``: also print
``pid <rank> <pid>`` and ``t <rank> <step> <seconds since the process started>``.

KIND: ``sigkill`` / ``sigterm`` (rank R sends itself the signal), ``sigterm-job`` (rank R sends SIGTERM to its
parent, torchrun, which tears every rank down), ``stop-peer`` (rank R freezes rank 0 with SIGSTOP for S seconds
and trains on: a clock reference that answers late), ``sleep`` (rank R sleeps S seconds), ``hold-gil`` (rank R spends S seconds
in one C call that keeps the GIL: a checkpoint pickling a large state, during which no other thread of that process
runs; the other ranks go on only once it holds). ``--where mid``: after the
backward of step STEP, inside the window recording it; ``boundary``: right after the forward of step STEP, where the
window that ended at step STEP - 1 is handed to the writer. Each rank prints ``step <rank> <i>`` after every step and
``done <rank>`` at the end (flushed), so a test knows how far it got.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fault", default="")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=-1)
    p.add_argument("--where", choices=("mid", "boundary"), default="mid")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--step-ms", type=float, default=20.0, help="sleep per step (so windows take real time)")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --slow-ms more every step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--times", action="store_true",
                   help="print 'pid <rank> <pid>' first and 't <rank> <step> <seconds since the process started>' "
                        "after every step")
    return p.parse_args()


def since_start() -> float:
    """Seconds since this process started."""
    from distprof.capture.sim import process_start_ns

    return (time.time_ns() - process_start_ns()) / 1e9


def inject(args: argparse.Namespace, rank: int, peer0_pid: int) -> None:
    if args.fault in ("sigkill", "sigterm"):
        os.kill(os.getpid(), signal.SIGKILL if args.fault == "sigkill" else signal.SIGTERM)
        time.sleep(30)  # SIGTERM: the handler runs between bytecodes; never go on training after it
    elif args.fault == "sigterm-job":
        os.kill(os.getppid(), signal.SIGTERM)
    elif args.fault == "stop-peer":
        os.kill(peer0_pid, signal.SIGSTOP)
        threading.Timer(args.seconds, os.kill, (peer0_pid, signal.SIGCONT)).start()
    elif args.fault == "sleep":
        time.sleep(args.seconds)
    elif args.fault == "hold-gil":
        import ctypes

        with open(HOLDING, "w"):  # the other ranks wait for this before they go on (wait_for_holder)
            pass
        ctypes.PyDLL(None).usleep(int(args.seconds * 1e6))  # PyDLL: the GIL stays held during the call


#: hold-gil: the holder creates this file just before it takes the GIL, so the other ranks reach their window end
#: (and ping) while it holds, however the machine schedules them (otherwise a peer can ping before the hold begins).
HOLDING = "fault-holding-gil"


def wait_for_holder(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(HOLDING) and time.monotonic() < deadline:
        time.sleep(0.005)


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    mine = rank == args.rank
    if args.times:
        print(f"pid {rank} {os.getpid()}", flush=True)
    for i in range(args.steps):
        loss = model(x).sum()
        if mine and i == args.at and args.where == "boundary":
            inject(args, rank, pids[0])
        time.sleep((args.step_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1000)
        loss.backward()
        if mine and i == args.at and args.where == "mid":
            inject(args, rank, pids[0])
        elif args.fault == "hold-gil" and i == args.at and args.where == "mid":
            wait_for_holder(args)
        opt.step()
        opt.zero_grad()
        print(f"step {rank} {i}", flush=True)
        if args.times:
            print(f"t {rank} {i} {since_start():.4f}", flush=True)
    print(f"done {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
