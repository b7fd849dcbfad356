"""DDP MLP (the seed's model) that records its own per-step wall times; used by capture_overhead.py.

    _timed_train.py STEPS BATCH HIDDEN OUT [torch WAIT WARMUP ACTIVE REPEAT]

With ``torch ...`` the loop runs under a bare ``torch.profiler.profile`` (CPU, record_shapes, profile_memory,
with_flops: distprof's defaults) with that schedule and ``prof.step()`` after each iteration; each window's trace is
exported with ``export_chrome_trace`` and loaded back with orjson (what a user of the bare profiler does to look at it)
inside on_trace_ready, timed apart, so torch's own stop = the closing step's ``prof.step()`` minus the export.
OUT.rank{r}.json: {"steps": [s per step], "step_call": [s per prof.step()], "export": [{window, export_s, load_s,
json_bytes, gzip_bytes}]}.
"""

import gzip
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps, batch, hidden, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bare = sys.argv[5:6] == ["torch"]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(batch, 1024), torch.randint(0, 10, (batch,))
times, calls, exports = [], [], []
prof = None
if bare:
    import orjson
    from torch.profiler import ProfilerActivity, profile, schedule

    wait, warmup, active, repeat = (int(v) for v in sys.argv[6:10])

    def on_ready(p):
        path = f"{out}.rank{rank}.w{len(exports)}.json"
        t0 = time.perf_counter()
        p.export_chrome_trace(path)
        t1 = time.perf_counter()
        with open(path, "rb") as fh:
            raw = fh.read()
        orjson.loads(raw)
        t2 = time.perf_counter()
        exports.append({"window": len(exports), "export_s": t1 - t0, "load_s": t2 - t1, "json_bytes": len(raw),
                        "gzip_bytes": len(gzip.compress(raw, 6)) if not exports else None})

    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait, warmup=warmup, active=active,
                                                                        repeat=repeat),
                   on_trace_ready=on_ready, record_shapes=True, profile_memory=True, with_flops=True)
    prof.start()
for _ in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if prof is not None:
        t1 = time.perf_counter()
        prof.step()
        calls.append(time.perf_counter() - t1)
    times.append(time.perf_counter() - t0)
if prof is not None:
    prof.stop()
with open(f"{out}.rank{rank}.json", "w") as fh:
    json.dump({"steps": times, "step_call": calls, "export": exports}, fh)
dist.destroy_process_group()
