"""Input rule: the main thread waiting for input (measured in :mod:`.measures`; DataLoader annotations
start with ``DATALOADER_PREFIX``).

* ``input_wait`` — the main thread waits for input. Input time = main-thread time in DataLoader ``__next__``
  (``enumerate(DataLoader)#…`` annotations) ∪ main-thread gaps at the step boundaries (from the step start to the
  first op, and from the last op to the step end; ops = ``cpu_op``/``user_annotation`` other than
  ``ProfilerStep#N``), minus time the rank's communication runs (that is waiting for peers, not input). Fires when
  it reaches ``input_min_step_pct`` (10 %) of step time and ``input_min_ms`` (0.5 ms) per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types import FindingRules
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..rank.measures import RankMeasures


def input_wait(ms: list[RankMeasures], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        w = m.input
        impact = pct(w.input_ms_per_step, m.step_ms)
        if impact >= rules.input_min_step_pct and w.input_ms_per_step >= rules.input_min_ms:
            h = Hit(m.rank, m.host, impact, {
                "input_ms_per_step": w.input_ms_per_step, "dataloader_ms_per_step": w.dataloader_ms_per_step,
                "boundary_gap_ms_per_step": w.boundary_gap_ms_per_step, "step_ms": m.step_ms,
                "threshold_step_pct": rules.input_min_step_pct, "threshold_ms": rules.input_min_ms})
            h.metrics["multiprocess_loader"] = float(any("MultiProcessing" in x for x in w.dataloader_names))
            hits.append(h)
    return hits


def input_wait_text(m, where, worst):
    title = f"Waiting for input on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"the main thread spends {m['input_ms_per_step']:.1f} ms of its {m['step_ms']:.1f} ms step waiting for "
          f"input: {m['dataloader_ms_per_step']:.1f} ms in DataLoader __next__ and "
          f"{m['boundary_gap_ms_per_step']:.1f} ms idle at the step boundary (before the first op or after the last). "
          f"Rule: >= {m['threshold_step_pct']:.0f} % of step time and >= {m['threshold_ms']:.1f} ms per step.")
    if m.get("multiprocess_loader", 0) >= 0.5:
        advice = ("The DataLoader workers cannot keep up: raise num_workers and prefetch_factor, set "
                  "persistent_workers=True and pin_memory=True, and make __getitem__ cheaper (pre-process offline, "
                  "decode or augment on the device).")
    else:
        advice = ("Load batches in background processes: DataLoader(num_workers=N > 0, pin_memory=True, "
                  "prefetch_factor=2 or more, persistent_workers=True), and move host-to-device copies off the "
                  "critical path (non_blocking=True). If the gap is not data loading, look for per-step work outside "
                  "any op (logging, checkpoints, time.sleep).")
    return title, ev, advice
