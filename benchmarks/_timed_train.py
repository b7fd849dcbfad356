"""DDP MLP (the seed's model) that records its own per-step wall times; used by capture_overhead.py."""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps, batch, hidden, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(batch, 1024), torch.randint(0, 10, (batch,))
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t0)
with open(f"{out}.rank{rank}.json", "w") as fh:
    json.dump(times, fh)
dist.destroy_process_group()
