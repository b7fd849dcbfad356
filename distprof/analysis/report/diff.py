"""Two runs of the same job compared: what got slower, where, and is it real.

    d = diff_runs(run_a, run_b)               # RunDiff (RunSummary of each: captured or imported, any world size)
    d.verdict, d.splits["rank"].parts, d.to_dict()

**Step time** of a run: per step the mean over ranks of ``step_ms`` (:func:`whatif.per_step_time_ms`); the diff
compares the means over steps, so that its parts add up. **Splits** of the change, each adding up to it exactly:

* ``phase`` — per step the mean over ranks of each breakdown phase (compute, memcpy, exposed communication, idle,
  other: they sum to the step).
* ``rank`` — the step's critical path (:mod:`.critical_path`): per step the time it runs through each rank's work
  segments and through transfers, scaled to the step time (path length ≠ mean step: the scale makes the parts sum
  to it). A rank that made the others wait gains time on the path; the ranks that waited do not.
* ``collective`` — exposed communication per (process group, op): per step the mean over ranks of each collective
  row's ``exposed_ns`` (time the rank waited in it doing nothing else), and the rest of the step.

**Comparisons** (not parts of the step: they need not add up): per op (own time per step and per call, the mean over
rank-steps), memory peaks (per step the largest rank's), FLOPs per step and achieved TFLOP/s (and MFU where the
device peak is known).

**Noise band** of each figure: the difference of the two means at ``z``-sigma confidence (3: 99.73 %, two-sided)
from the step-to-step spread — Welch's standard error and Student's t at Welch–Satterthwaite's degrees of freedom
(with 8 steps a run, 3 standard errors alone are only ~98 %), each run's step count cut to its effective size
``n (1 − ρ) / (1 + ρ)`` where its steps' lag-1 autocorrelation ρ is positive (load that comes in spells makes
neighbouring steps alike, and iid errors too small; from 10 steps, ρ at most 0.5) — and at least ``floor_pct`` % of
A's step time (for a comparison: of its A value): the run-to-run drift one run's steps cannot show (a whole run on a
slower core). 5 % suits dedicated accelerator nodes; on shared hosts it can be more (``distprof diff --noise-floor
PCT``). A change is **significant** when it is larger than its band; the verdict says when the step time's change
is inside the noise. A run compared with itself has no change.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cross.stragglers import t_quantile
from ..graph.critical_path import critical_paths, replay, step_graph
from ..graph.whatif import per_step_time_ms

if TYPE_CHECKING:
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["DiffLateness", "DiffRules", "OpCalls", "Part", "RankLateness", "Split", "RunDiff", "diff_runs", "PHASES"]

#: Breakdown phases that sum to the step (breakdown.py), and their labels.
PHASES = (("compute_ms", "compute"), ("memcpy_ms", "memcpy"), ("exposed_comm_ms", "exposed communication"),
          ("idle_ms", "idle"), ("other_ms", "other"))


@dataclass(frozen=True)
class DiffRules:
    z: float = 3.0  # the band's confidence, in normal sigmas (Student's t at that confidence is used)
    floor_pct: float = 5.0  # least band, % of A's step time (comparisons: of their A value)
    top_ops: int = 10  # ops listed
    top_parts: int = 8  # rank / collective parts listed (the rest summed into one part)
    op_floor_pct: float = 1.0  # an op's least band, % of A's step time (a 10 us change is not worth naming)


@dataclass
class Part:
    """One part of a split or one comparison: A's and B's mean per step, the change and its noise band."""

    label: str
    a: float | None
    b: float | None
    delta: float
    band: float
    significant: bool
    share_pct: float | None = None  # of the step time's change (parts of a split)
    op: OpCalls | None = None  # an op's calls per step (the ops comparison only)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "a": self.a, "b": self.b, "delta": self.delta, "band": self.band,
                "significant": self.significant, "share_pct": self.share_pct,
                **(asdict(self.op) if self.op is not None else {})}


@dataclass
class OpCalls:
    """An op's calls per step in each run, and its time per call (None without calls)."""

    calls_a: float
    calls_b: float
    per_call_a_ms: float | None
    per_call_b_ms: float | None


@dataclass
class RankLateness:
    """A rank named a straggler in either run: its mean lateness in each (None: not in that run's analysis)."""

    rank: int
    lateness_a_ms: float | None
    lateness_b_ms: float | None


@dataclass
class DiffLateness:
    named_a: list[int]
    named_b: list[int]
    ranks: list[RankLateness]


@dataclass
class Split:
    name: str
    parts: list[Part]

    @property
    def total(self) -> float:
        return float(sum(p.delta for p in self.parts))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "total_delta_ms": self.total, "parts": [p.to_dict() for p in self.parts]}


@dataclass
class RunDiff:
    a_id: str
    b_id: str
    a_world: int
    b_world: int
    step: Part  # the step time (ms)
    splits: dict[str, Split]
    ops: list[Part]
    memory: list[Part]
    flops: list[Part]
    lateness: DiffLateness
    verdict: str
    rules: DiffRules

    @property
    def significant(self) -> bool:
        return self.step.significant

    def to_dict(self) -> dict[str, Any]:
        return {"format": "distprof-diff", "a": {"id": self.a_id, "world_size": self.a_world},
                "b": {"id": self.b_id, "world_size": self.b_world}, "verdict": self.verdict,
                "significant": self.significant, "step_time": self.step.to_dict(),
                "splits": {k: v.to_dict() for k, v in self.splits.items()},
                "ops": [p.to_dict() for p in self.ops], "memory": [p.to_dict() for p in self.memory],
                "flops": [p.to_dict() for p in self.flops], "lateness": asdict(self.lateness),
                "rules": {"z": self.rules.z, "floor_pct": self.rules.floor_pct}}


@dataclass(frozen=True)
class _Sample:
    """Per-step values of one figure in one run: mean, variance of the mean, and degrees of freedom."""

    mean: float
    var_mean: float
    df: float

    @classmethod
    def of(cls, v: np.ndarray) -> "_Sample":
        v = np.asarray(v, np.float64)
        n = v.size
        if n == 0:
            return cls(0.0, 0.0, math.inf)
        if n == 1:
            return cls(float(v[0]), 0.0, math.inf)
        n_eff = n * _ar1_factor(v)
        return cls(float(v.mean()), float(v.var(ddof=1)) / n_eff, max(n_eff - 1.0, 1.0))


#: Fewest steps from which the lag-1 autocorrelation is estimated (with fewer, ρ̂ swings by ±0.3 on iid steps), and
#: the largest ρ used (a factor of 3 on the variance of the mean at most: a noisy ρ̂ must not make every band huge).
AR1_MIN_STEPS = 10
AR1_MAX_RHO = 0.5


def _ar1_factor(v: np.ndarray) -> float:
    """(1 − ρ) / (1 + ρ) for the lag-1 autocorrelation ρ of `v` where positive (capped at AR1_MAX_RHO), else 1."""
    if v.size < AR1_MIN_STEPS:
        return 1.0
    d = v - v.mean()
    den = float(d @ d)
    if den <= 0.0:
        return 1.0
    rho = min(max(float(d[1:] @ d[:-1]) / den, 0.0), AR1_MAX_RHO)
    return (1.0 - rho) / (1.0 + rho)


def _band_width(a: _Sample, b: _Sample, z: float) -> float:
    """Half-width of the z-sigma two-sided interval of b.mean − a.mean (Welch; Student's t, Satterthwaite's df)."""
    var = a.var_mean + b.var_mean
    if var <= 0.0:
        return 0.0
    df = var**2 / sum(x.var_mean**2 / x.df for x in (a, b) if x.var_mean > 0.0)
    tail = 0.5 * math.erfc(z / math.sqrt(2.0))  # one-sided tail of the normal at z
    q = t_quantile(tail, max(int(df), 1)) if df < 1000 else z
    return q * math.sqrt(var)


def _part(label: str, a: np.ndarray | None, b: np.ndarray | None, floor: float, rules: DiffRules) -> Part:
    """A part from per-step values of A and B (None: absent in that run, counted as 0)."""
    sa = _Sample.of(a if a is not None else np.zeros(0))
    sb = _Sample.of(b if b is not None else np.zeros(0))
    band = max(_band_width(sa, sb, rules.z), floor)
    delta = sb.mean - sa.mean
    return Part(label, sa.mean if a is not None else None, sb.mean if b is not None else None, delta, band,
                bool(abs(delta) > band and delta != 0.0))


class _Run:
    """Per-step series of one run (each fact from its home module)."""

    def __init__(self, run: RunSummary):
        self.run = run
        self.steps, self.step_ms = per_step_time_ms(run)
        st = run.steps
        si = np.searchsorted(self.steps, np.asarray(st["step"], np.int64))
        n = np.maximum(np.bincount(si, minlength=self.steps.size), 1)
        self.si, self.n = si, n
        self.phase = {c: np.bincount(si, weights=np.asarray(st[c], np.float64), minlength=self.steps.size) / n
                      for c, _ in PHASES}

    def rank_parts(self) -> dict[str, np.ndarray]:
        """Per-step critical-path time per rank's work and in transfers, scaled to the step time."""
        g = step_graph(self.run)
        cp = critical_paths(g, replay(g))
        out: dict[str, np.ndarray] = {}
        if cp.steps.size == 0:
            return {"unattributed": self.step_ms.copy()}
        j = np.searchsorted(self.steps, cp.steps)
        scale = np.zeros(self.steps.size)
        ok = cp.length_ms > 0
        scale[j[ok]] = self.step_ms[j[ok]] / cp.length_ms[ok]
        for i, r in enumerate(cp.ranks.tolist()):
            v = np.zeros(self.steps.size)
            v[j] = cp.work_ms[:, i]
            out[f"rank {r}"] = v * scale
        v = np.zeros(self.steps.size)
        v[j] = cp.transfer_ms
        out["communication (transfers)"] = v * scale
        covered = np.zeros(self.steps.size, bool)
        covered[j[ok]] = True
        if not covered.all():  # steps without a path (no rank-step): the whole step unattributed
            out["unattributed"] = np.where(covered, 0.0, self.step_ms)
        return out

    def collective_parts(self) -> dict[str, np.ndarray]:
        """Per step: exposed communication per (group, op), mean over ranks; and the rest of the step."""
        rows = self.run.collective_rows
        out: dict[str, np.ndarray] = {}
        step = np.asarray(rows["step"], np.int64)
        inside = np.isin(step, self.steps)
        pg_names = {int(p.get("index", i)): str(p.get("desc") or p.get("name") or i)
                    for i, p in enumerate(self.run.process_groups or [])}
        if inside.any():
            si = np.searchsorted(self.steps, step[inside])
            pg = np.asarray(rows["pg"], np.int64)[inside]
            op = np.asarray(rows["op_id"], np.int64)[inside]
            ex = np.asarray(rows["exposed_ns"], np.float64)[inside] / 1e6
            n_ranks = np.bincount(self.si, minlength=self.steps.size).astype(np.float64)
            keys = np.stack([pg, op], axis=1)
            uk, ki = np.unique(keys, axis=0, return_inverse=True)
            ki = ki.reshape(-1)
            for k, (g, o) in enumerate(uk.tolist()):
                sel = ki == k
                v = np.bincount(si[sel], weights=ex[sel], minlength=self.steps.size) / np.maximum(n_ranks, 1)
                out[f"{self.run.names[o]} on group {pg_names.get(g, g)}"] = v
        rest = self.step_ms - sum(out.values()) if out else self.step_ms.copy()
        out["rest of the step"] = rest
        return out

    def op_series(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per op name: per step the mean over ranks of its own time (ms) and of its calls (one bincount per rank
        into a names × steps grid; no loop over names)."""
        ranks = [s for s in self.run.ranks.values() if s.op_totals["name"].size]
        if not ranks or not self.steps.size:
            return {}
        ids: dict[str, int] = {}  # names by first appearance: a dict, not np.unique on objects (Python compares)
        luts = [np.fromiter((ids.setdefault(str(n), len(ids)) for n in s.op_names), np.int64, len(s.op_names))
                for s in ranks]
        names = np.array(list(ids), dtype=object)
        ns = self.steps.size
        ms = np.zeros(names.size * ns)
        calls = np.zeros(names.size * ns)
        for s, lut in zip(ranks, luts):
            t = s.op_totals
            keep = np.isin(t["step"], self.steps)
            gid = lut[t["name"][keep]]
            cell = gid * ns + np.searchsorted(self.steps, t["step"][keep])
            ms += np.bincount(cell, weights=t["dur_ms"][keep], minlength=ms.size)
            calls += np.bincount(cell, weights=t["calls"][keep], minlength=calls.size)
        den = np.maximum(np.bincount(self.si, minlength=ns).astype(np.float64), 1)
        ms, calls = ms.reshape(names.size, ns) / den, calls.reshape(names.size, ns) / den
        seen = np.flatnonzero(calls.sum(axis=1) > 0)
        return {str(names[i]): (ms[i], calls[i]) for i in seen.tolist()}

    def per_step_max(self, col: str) -> np.ndarray:
        st = self.run.steps
        out = np.zeros(self.steps.size)
        np.maximum.at(out, self.si, np.asarray(st[col], np.float64))
        return out

    def per_step_sum(self, col: str) -> np.ndarray:
        return np.bincount(self.si, weights=np.asarray(self.run.steps[col], np.float64), minlength=self.steps.size)


def _split(name: str, a: dict[str, np.ndarray], b: dict[str, np.ndarray], total_delta: float, floor: float,
           rules: DiffRules, top: int | None = None) -> Split:
    labels = list(dict.fromkeys([*a, *b]))
    parts = [_part(k, a.get(k), b.get(k), floor, rules) for k in labels]
    if top is not None and len(parts) > top + 1:
        parts.sort(key=lambda p: -abs(p.delta))
        keep, rest = parts[:top], parts[top:]
        ra = sum((a[p.label] for p in rest if p.label in a), 0.0) if any(p.label in a for p in rest) else None
        rb = sum((b[p.label] for p in rest if p.label in b), 0.0) if any(p.label in b for p in rest) else None
        parts = keep + [_part(f"{len(rest)} others", ra, rb, floor, rules)]
    for p in parts:
        p.share_pct = 100.0 * p.delta / total_delta if total_delta != 0 else None
    return Split(name, parts)


def _lateness(a: RunSummary, b: RunSummary) -> DiffLateness:
    """Per rank named a straggler in either run: its lateness in A and in B (the stragglers analysis)."""
    from ..cross.stragglers import find_stragglers

    sa, sb = find_stragglers(a), find_stragglers(b)
    la = {d.rank: d.lateness_ms for d in sa.ranks}
    lb = {d.rank: d.lateness_ms for d in sb.ranks}
    named = sorted(set(sa.info.named) | set(sb.info.named))
    return DiffLateness(list(sa.info.named), list(sb.info.named),
                        [RankLateness(r, la.get(r), lb.get(r)) for r in named])


def diff_runs(a: RunSummary, b: RunSummary, *, rules: DiffRules | None = None,
              labels: tuple[str, str] | None = None) -> RunDiff:
    """Compare run `b` with run `a` (see the module docstring); `labels` name them (default: their run ids)."""
    rules = rules or DiffRules()
    ra, rb = _Run(a), _Run(b)
    base = float(ra.step_ms.mean()) if ra.step_ms.size else 0.0
    floor = rules.floor_pct / 100.0 * base
    step = _part("step time", ra.step_ms, rb.step_ms, floor, rules)
    total = step.delta
    splits = {
        "phase": _split("phase", {lab: ra.phase[c] for c, lab in PHASES}, {lab: rb.phase[c] for c, lab in PHASES},
                        total, floor, rules),
        "rank": _split("rank", ra.rank_parts(), rb.rank_parts(), total, floor, rules, top=rules.top_parts),
        "collective": _split("collective", ra.collective_parts(), rb.collective_parts(), total, floor, rules,
                             top=rules.top_parts),
    }
    ops = _ops(ra, rb, rules)
    memory = [_part("peak allocated memory, largest rank (MiB)", ra.per_step_max("peak_mem_bytes") / 2**20,
                    rb.per_step_max("peak_mem_bytes") / 2**20, 0.0, rules)]
    memory = [_rel_floor(p, rules) for p in memory]
    flops = _flops(a, b, ra, rb, rules)
    lat = _lateness(a, b)
    la, lb = labels or (a.run_id, b.run_id)
    d = RunDiff(la, lb, a.world_size, b.world_size, step, splits, ops, memory, flops, lat, "", rules)
    d.verdict = verdict(d)
    return d


def _rel_floor(p: Part, rules: DiffRules, least: float = 0.0) -> Part:
    """A comparison's band: at least floor_pct % of its A value (and `least`)."""
    floor = max(rules.floor_pct / 100.0 * abs(p.a or 0.0), least)
    if p.band < floor:
        p.band = floor
        p.significant = bool(abs(p.delta) > floor and p.delta != 0.0)
    return p


def _ops(ra: _Run, rb: _Run, rules: DiffRules) -> list[Part]:
    sa, sb = ra.op_series(), rb.op_series()
    base = float(ra.step_ms.mean()) if ra.step_ms.size else 0.0
    out = []
    for nm in set(sa) | set(sb):
        a_ms, a_calls = sa.get(nm, (None, None))
        b_ms, b_calls = sb.get(nm, (None, None))
        p = _rel_floor(_part(nm, a_ms, b_ms, 0.0, rules), rules, rules.op_floor_pct / 100.0 * base)
        ca = float(a_calls.mean()) if a_calls is not None and a_calls.size else 0.0
        cb = float(b_calls.mean()) if b_calls is not None and b_calls.size else 0.0
        p.op = OpCalls(ca, cb, (p.a / ca) if ca and p.a is not None else None,
                       (p.b / cb) if cb and p.b is not None else None)
        out.append(p)
    out.sort(key=lambda p: (not p.significant, -abs(p.delta)))
    return out[: rules.top_ops]


def _flops(a: RunSummary, b: RunSummary, ra: _Run, rb: _Run, rules: DiffRules) -> list[Part]:
    out = []
    fa, fb = ra.per_step_sum("flops"), rb.per_step_sum("flops")
    if fa.any() or fb.any():
        out.append(_rel_floor(_part("FLOPs per step (all ranks, GFLOP)", fa / 1e9, fb / 1e9, 0.0, rules), rules))
        ta = np.where(ra.step_ms > 0, fa / np.maximum(ra.step_ms, 1e-9) / 1e9, 0.0)
        tb = np.where(rb.step_ms > 0, fb / np.maximum(rb.step_ms, 1e-9) / 1e9, 0.0)
        out.append(_rel_floor(_part("achieved TFLOP/s (all ranks)", ta, tb, 0.0, rules), rules))
    from ..cross.mfu import mfu

    ma, mb = mfu(a), mfu(b)
    if ma and mb:
        va = np.array([m.mfu for m in ma if m.mfu is not None]) * 100
        vb = np.array([m.mfu for m in mb if m.mfu is not None]) * 100
        out.append(_rel_floor(_part("MFU % (per rank)", va, vb, 0.0, rules), rules))
    return out


def _pct(x: float, of: float) -> str:
    return f"{100 * x / of:.0f} %" if of else "n/a"


def verdict(d: RunDiff) -> str:
    """One paragraph: how much slower or faster B is, where, and whether it is inside the noise."""
    s = d.step
    a, b = s.a or 0.0, s.b or 0.0
    head = (f"B ({d.b_id}) against A ({d.a_id}): step time {a:.2f} ms -> {b:.2f} ms "
            f"({s.delta:+.2f} ms, noise band +/-{s.band:.2f} ms)")
    if d.a_world != d.b_world:
        head += f"; world size {d.a_world} -> {d.b_world}"
    if not s.significant:
        sig = [p for sp in d.splits.values() for p in sp.parts if p.significant]
        tail = (f"; within the noise, though {sig[0].label} changed by {sig[0].delta:+.2f} ms per step"
                if sig else "; no part of the step changed beyond its noise either")
        return head + ": the change is inside the noise (no significant change)" + tail + "."
    word = "slower" if s.delta > 0 else "faster"
    out = [head + f": B is {abs(s.delta) / a * 100:.0f} % {word} per step." if a else head + "."]

    def lead(split: str) -> Part | None:
        parts = [p for p in d.splits[split].parts if p.significant and np.sign(p.delta) == np.sign(s.delta)]
        return max(parts, key=lambda p: abs(p.delta)) if parts else None

    pr = lead("rank")
    if pr is not None:
        who = f"{pr.label}'s work" if pr.label.startswith("rank ") else pr.label
        moved = [p for p in d.splits["rank"].parts if p.label.startswith("rank ") and p is not pr
                 and np.sign(p.delta) == -np.sign(s.delta) and abs(p.delta) > p.band]
        note = ""
        if moved and abs(pr.delta) > abs(s.delta):  # > 100 %: the path moved onto this rank from others
            m = max(moved, key=lambda p: abs(p.delta))
            note = (f"; the path moved {'to' if pr.delta > 0 else 'from'} it {'from' if pr.delta > 0 else 'to'} "
                    f"{m.label} ({m.delta:+.2f} ms), which held part of A's path")
        out.append(f"On the critical path, {who} {'grew' if pr.delta > 0 else 'shrank'} by "
                   f"{abs(pr.delta):.2f} ms per step ({_pct(pr.delta, s.delta)} of the change{note}).")
    pp = lead("phase")
    if pp is not None:
        out.append(f"By phase, most of it is {pp.label} ({pp.delta:+.2f} ms, {_pct(pp.delta, s.delta)}).")
    pc = lead("collective")
    if pc is not None and pc.label != "rest of the step":
        out.append(f"Exposed {pc.label}: {pc.delta:+.2f} ms ({_pct(pc.delta, s.delta)}).")
    late = [r for r in d.lateness.ranks if r.lateness_b_ms is not None]
    for r in late[:2]:
        if r.rank in d.lateness.named_b:
            la = r.lateness_a_ms
            out.append(f"Rank {r.rank} arrives {r.lateness_b_ms:.1f} ms after its peers at the collectives"
                       + (f" (A: {la:.1f} ms)." if la is not None else "."))
    sig_ops = [p for p in d.ops if p.significant][:2]
    if sig_ops:
        out.append("Ops: " + "; ".join(f"{p.label} {p.delta:+.2f} ms per step" for p in sig_ops) + ".")
    return " ".join(out)
