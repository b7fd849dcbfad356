"""The fixed runs whose reports, terminal summaries, timelines and exports tests/test_golden.py pins down.

Each case builds a run directory deterministically: synthetic shards (``synth.make_run``, seeded), real Kineto traces
imported from tests/data/hta, and one real 4-rank DDP capture committed as shards (tests/data/golden/ddp4_capture:
``examples/ddp_mlp.py --hidden 128 --steps 10 --slow-rank 2 --slow-ms 15`` under
``distprof.launch --wait 1 --warmup 1 --active 3 --repeat 2``, distprof 0.1.0, schema 1.1).

Regenerate the expected outputs (after a change that is meant to change them, reviewing the diff):
``DISTPROF_UPDATE_GOLDEN=1 python -m pytest -q tests/test_golden.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from synth import make_run

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = DATA / "golden" / "expected"
HTA = DATA / "hta"


def _synth(**kw) -> Callable[[Path], Path]:
    def build(out: Path) -> Path:
        return make_run(out, **kw).run_dir

    return build


def _imported(files: list[str], **kw) -> Callable[[Path], Path]:
    def build(out: Path) -> Path:
        from distprof.importers.run import import_traces

        import_traces([HTA / f for f in files], out / "run", progress=False, **kw)
        return out / "run"

    return build


def _capture(out: Path) -> Path:
    dst = out / "ddp4slow"
    shutil.copytree(DATA / "golden" / "ddp4_capture", dst)
    return dst


#: name -> builder(out_dir) -> run directory
CASES: dict[str, Callable[[Path], Path]] = {
    "synth_2r": _synth(world_size=2, run_id="s2"),
    "synth_4r_idle_late": _synth(world_size=4, late_rank=1, late_ms=20, late_kind="idle", run_id="s4", seed=3),
    "synth_2host_no_samples": _synth(world_size=4, hosts=[0, 0, 1, 1], clocks={1: (2.0, 0.0)}, clock_sync=False,
                                     run_id="s5"),
    "hta_trace_filter": _imported(["trace_filter/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"]),
    "hta_nccl_data": _imported(["nccl_parser_config/nccl_data.json.gz"]),
    "hta_amd": _imported(["amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"], rank=0),
    "hta_cpu_only": _imported(["cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"]),
    "hta_ns_resolution": _imported(["ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]),
    "capture_ddp4": _capture,
}
