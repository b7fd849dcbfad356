"""Memory rule: allocator churn and peak swings between steps (measured in :mod:`.measures`).

* ``memory_churn`` — from ``run.memory`` (allocator events) per rank and step. *Churn* fires when allocations run at
  ≥ ``churn_min_allocs_per_ms`` (20) per ms of step time and ≥ ``churn_min_allocs_per_step`` (500) per step, or when
  the bytes allocated per step are ≥ ``churn_min_turnover`` (8) × the step's swing of allocated memory (max − min)
  and ≥ ``churn_min_alloc_mib`` (64 MiB). *Swing between steps* fires when the per-step peak of allocated memory
  varies by ≥ ``swing_min_pct`` (50 %) of its mean across steps and ≥ ``swing_min_mib`` (64 MiB). No time is
  measured for it: severity is medium when a measure is ≥ 2× its threshold, else low.
"""

from __future__ import annotations

from .rules import FindingRules, Hit


def memory_churn(ms: list[dict], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        if not m["memory_events"]:
            continue
        rate = (m["allocs_per_ms"] / rules.churn_min_allocs_per_ms
                if m["allocs_per_step"] >= rules.churn_min_allocs_per_step else 0.0)
        turn = (m["turnover"] / rules.churn_min_turnover
                if m["alloc_mib_per_step"] >= rules.churn_min_alloc_mib else 0.0)
        swing = (m["peak_swing_mib"] / m["peak_mib_mean"] * 100.0 / rules.swing_min_pct
                 if m["peak_swing_mib"] >= rules.swing_min_mib and m["peak_mib_mean"] > 0 else 0.0)
        worst = max(rate, turn, swing)
        if worst < 1.0:
            continue
        hits.append(Hit(m["rank"], m["host"], 0.0, {
            "allocs_per_step": m["allocs_per_step"], "allocs_per_ms": m["allocs_per_ms"],
            "alloc_mib_per_step": m["alloc_mib_per_step"], "swing_mib_per_step": m["swing_mib_per_step"],
            "turnover": m["turnover"], "peak_mib_mean": m["peak_mib_mean"], "peak_swing_mib": m["peak_swing_mib"],
            "churn_rate": float(rate >= 1.0), "churn_turnover": float(turn >= 1.0), "churn_swing": float(swing >= 1.0),
            "threshold_allocs_per_ms": rules.churn_min_allocs_per_ms,
            "threshold_allocs_per_step": rules.churn_min_allocs_per_step,
            "threshold_turnover": rules.churn_min_turnover, "threshold_alloc_mib": rules.churn_min_alloc_mib,
            "threshold_swing_pct": rules.swing_min_pct, "threshold_swing_mib": rules.swing_min_mib,
            "times_threshold": worst}, severity="medium" if worst >= 2.0 else "low"))
    return hits


def memory_churn_text(m, where, worst):
    kinds = []
    if m["churn_rate"] >= 0.5:
        kinds.append(f"{m['allocs_per_step']:.0f} allocations per step ({m['allocs_per_ms']:.0f} per ms)")
    if m["churn_turnover"] >= 0.5:
        kinds.append(f"{m['alloc_mib_per_step']:.0f} MiB allocated per step, {m['turnover']:.1f}x its "
                     f"{m['swing_mib_per_step']:.0f} MiB swing")
    if m["churn_swing"] >= 0.5:
        kinds.append(f"the per-step peak varies by {m['peak_swing_mib']:.0f} MiB around {m['peak_mib_mean']:.0f} MiB")
    title = f"Memory churn on {where}: " + "; ".join(kinds)
    ev = (f"{m['allocs_per_step']:.0f} allocations per step ({m['allocs_per_ms']:.1f} per ms), "
          f"{m['alloc_mib_per_step']:.1f} MiB allocated per step against a swing of {m['swing_mib_per_step']:.1f} MiB "
          f"(turnover {m['turnover']:.1f}x); per-step peak {m['peak_mib_mean']:.1f} MiB, varying by "
          f"{m['peak_swing_mib']:.1f} MiB. Rule: >= {m['threshold_allocs_per_ms']:.0f} allocations per ms and >= "
          f"{m['threshold_allocs_per_step']:.0f} per step, or turnover >= {m['threshold_turnover']:.0f}x with >= "
          f"{m['threshold_alloc_mib']:.0f} MiB per step, or a per-step peak varying by >= "
          f"{m['threshold_swing_pct']:.0f} % and >= {m['threshold_swing_mib']:.0f} MiB.")
    advice = ("Reuse buffers instead of allocating per step (preallocate, in-place ops, out= arguments, no torch.cat "
              "in loops), keep input shapes fixed (pad or bucket variable lengths), and on CUDA set "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; record the allocator history (--memory-history on "
              "CUDA) to see which code allocates.")
    return title, ev, advice
