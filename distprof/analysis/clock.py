"""Clock alignment across hosts: pure functions from clock-sync samples and matched collectives.

Model (Score-P style, docs/shard-format.md §/clock): for each host other than the reference, each window's ping-pongs
give one offset at the window start (phase 0) and one at its end (phase 1); in between the offset is linear
(piecewise per window). A recorded time ``t`` of a rank on that host in window ``w`` becomes

    aligned = t + rint(offset_w + slope_w · (t − t_w))

Ranks on one host share its clock (``clock_role`` member → its leader's samples); the reference host has offset 0.
Hosts without samples (imported traces, failed sync) are aligned from matched collectives instead: the median of
(end on the reference host − end on this host) over synchronising collectives, per window. Afterwards the alignment is
checked: no rank can finish a synchronising collective before the last rank entered it, so
``max(0, max_start − min_end)`` per instance is a clock error the model failed to remove (the *residual*).

The :class:`~distprof.analysis.model.HostClock` summaries hold the offset at the first window start and the drift of a
least-squares line through all of the host's window offsets; the piecewise model (:class:`ClockModel`) is what load_run
applies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .matching import Collectives, realign
from .model import HostClock

log = logging.getLogger(__name__)

Table = dict[str, np.ndarray]

#: Share of lowest-RTT samples kept per phase, and the minimum kept.
KEEP_FRACTION = 0.25
MIN_KEEP = 3


def phase_offsets(samples: Table, *, keep_fraction: float = KEEP_FRACTION, min_keep: int = MIN_KEEP) -> Table:
    """One offset estimate per phase from NTP-style samples of one rank and window.

    offset = t_remote − (t_send + t_recv)/2 (the value to add to local times), median over the lowest-RTT samples.
    Returns columns phase u1, t_local_ns i8 (local midpoint, median of the kept), offset_ns f8, rtt_min_ns i8,
    spread_ns f8 (max − min offset of the kept), n i8 (samples), n_kept i8 — one row per phase present.
    """
    phase = np.asarray(samples.get("phase", np.zeros(0)), dtype=np.int64)
    out: dict[str, list] = {k: [] for k in ("phase", "t_local_ns", "offset_ns", "rtt_min_ns", "spread_ns", "n", "n_kept")}
    if len(phase) == 0:
        return _phase_table(out)
    send = np.asarray(samples["t_send_ns"], dtype=np.int64)
    recv = np.asarray(samples["t_recv_ns"], dtype=np.int64)
    remote = np.asarray(samples["t_remote_ns"], dtype=np.int64)
    rtt = recv - send
    ok = rtt >= 0
    half = rtt.astype(np.float64) / 2.0
    # t_remote − t_send − rtt/2, in int64 before going to float (epoch ns do not fit a double exactly)
    offset = (remote - send).astype(np.float64) - half
    for ph in np.unique(phase[ok]):  # at most 2 phases
        idx = np.flatnonzero(ok & (phase == ph))
        k = max(min_keep, int(np.ceil(keep_fraction * len(idx))))
        k = min(k, len(idx))
        kept = idx[np.argsort(rtt[idx], kind="stable")[:k]]
        mid_rel = np.median((send[kept] - send[kept[0]]).astype(np.float64) + half[kept])
        out["phase"].append(int(ph))
        out["t_local_ns"].append(int(send[kept[0]] + int(round(mid_rel))))
        out["offset_ns"].append(float(np.median(offset[kept])))
        out["rtt_min_ns"].append(int(rtt[kept].min()))
        out["spread_ns"].append(float(offset[kept].max() - offset[kept].min()))
        out["n"].append(len(idx))
        out["n_kept"].append(k)
    return _phase_table(out)


def _phase_table(d: dict[str, list]) -> Table:
    dt = {"phase": np.uint8, "t_local_ns": np.int64, "offset_ns": np.float64, "rtt_min_ns": np.int64,
          "spread_ns": np.float64, "n": np.int64, "n_kept": np.int64}
    return {k: np.asarray(v, dtype=dt[k]) for k, v in d.items()}


@dataclass(frozen=True)
class Segment:
    """aligned = t + rint(offset_ns + slope · (t − t_ref_ns)) for one host and window (slope = drift_ppm · 1e-6)."""

    t_ref_ns: int
    offset_ns: float
    slope: float = 0.0

    def apply(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        return t + np.rint(self.offset_ns + self.slope * (t - self.t_ref_ns).astype(np.float64)).astype(np.int64)


def fit_segments(estimates: Mapping[int, Table]) -> tuple[dict[int, Segment], Segment | None]:
    """Per-window segments from phase estimates (window -> phase_offsets table), and a global line.

    A window with both phases gets the line through them; with one phase, that offset and the global slope. The global
    line is a least-squares fit through every phase estimate (slope 0 with a single time).
    """
    ts = [np.asarray(e["t_local_ns"], dtype=np.int64) for e in estimates.values() if len(e["phase"])]
    os_ = [np.asarray(e["offset_ns"], dtype=np.float64) for e in estimates.values() if len(e["phase"])]
    if not ts:
        return {}, None
    t_all, o_all = np.concatenate(ts), np.concatenate(os_)
    t_ref = int(t_all.min())
    x = (t_all - t_ref).astype(np.float64)
    if len(x) >= 2 and np.ptp(x) > 0:
        slope, icpt = np.polyfit(x, o_all, 1)
    else:
        slope, icpt = 0.0, float(np.mean(o_all))
    glob = Segment(t_ref, float(icpt), float(slope))
    segs: dict[int, Segment] = {}
    for w, e in estimates.items():
        if len(e["phase"]) == 0:
            continue
        order = np.argsort(e["t_local_ns"])
        t = np.asarray(e["t_local_ns"], dtype=np.int64)[order]
        o = np.asarray(e["offset_ns"], dtype=np.float64)[order]
        if len(t) >= 2 and t[-1] > t[0]:
            segs[w] = Segment(int(t[0]), float(o[0]), float((o[-1] - o[0]) / float(t[-1] - t[0])))
        else:
            segs[w] = Segment(int(t[0]), float(o[0]), float(slope))
    return segs, glob


@dataclass
class ClockModel:
    """Piecewise alignment per (host, window), plus the per-host summaries for MergedRun.clock."""

    reference_host: str
    rank_host: dict[int, str]
    hosts: dict[str, HostClock]
    segments: dict[tuple[str, int], Segment] = field(default_factory=dict)
    fallback: dict[str, Segment] = field(default_factory=dict)  # host -> line used for windows without a segment
    warnings: list[str] = field(default_factory=list)

    def segment(self, host: str, window: int) -> Segment:
        seg = self.segments.get((host, window)) or self.fallback.get(host)
        return seg if seg is not None else Segment(0, 0.0, 0.0)

    def align(self, rank: np.ndarray, window: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Aligned times for rows (rank, window, recorded t); vectorised through a (rank, window) parameter table."""
        t = np.asarray(t, dtype=np.int64)
        if len(t) == 0:
            return t.copy()
        rank = np.asarray(rank, dtype=np.int64)
        window = np.asarray(window, dtype=np.int64)
        r_max = int(max(rank.max(), max(self.rank_host, default=0))) + 1
        w_min, w_max = int(window.min()), int(window.max())
        nw = w_max - w_min + 1
        tref = np.zeros((r_max, nw), dtype=np.int64)
        off = np.zeros((r_max, nw), dtype=np.float64)
        slope = np.zeros((r_max, nw), dtype=np.float64)
        for r, host in self.rank_host.items():  # per rank × window
            if r >= r_max:
                continue
            for w in range(w_min, w_max + 1):
                seg = self.segment(host, w)
                tref[r, w - w_min], off[r, w - w_min], slope[r, w - w_min] = seg.t_ref_ns, seg.offset_ns, seg.slope
        wi = window - w_min
        dt = (t - tref[rank, wi]).astype(np.float64)
        return t + np.rint(off[rank, wi] + slope[rank, wi] * dt).astype(np.int64)


@dataclass
class RankClockInfo:
    """What the clock model needs to know about one rank (from its shards' attributes)."""

    rank: int
    host: str
    role: str | None = None  # reference / leader / member / None (unknown)
    leader: int | None = None
    reference: int | None = None


def reference_of(infos: Mapping[int, RankClockInfo]) -> tuple[int, str]:
    """(reference rank, reference host): from clock_reference attributes, else the lowest rank."""
    refs = [i.reference for i in infos.values() if i.reference is not None]
    if refs:
        ref = int(np.bincount(np.asarray(refs)).argmax())
        if ref in infos:
            return ref, infos[ref].host
        # the reference rank's shard is missing: its host is where members follow it as leader
        for i in sorted(infos.values(), key=lambda i: i.rank):
            if i.leader == ref:
                return ref, i.host
    low = min(infos)
    return low, infos[low].host


def estimate_clocks(
    infos: Mapping[int, RankClockInfo],
    samples: Mapping[tuple[int, int], Table],
    collectives: Collectives | None = None,
    *,
    names: np.ndarray | None = None,
    windows: Sequence[int] | None = None,
    keep_fraction: float = KEEP_FRACTION,
    min_keep: int = MIN_KEEP,
) -> ClockModel:
    """Build the clock model of a run.

    infos: rank -> RankClockInfo for every rank with data.
    samples: (rank, window) -> /clock/samples columns (only ranks that have samples).
    collectives: matched instances on **raw** times (for the fallback and the residual check); names: global string
    table (to pick synchronising ops).
    windows: windows to build segments for (default: those with samples or collectives).
    """
    ref_rank, ref_host = reference_of(infos)
    rank_host = {r: i.host for r, i in infos.items()}
    hosts = sorted(set(rank_host.values()))
    model = ClockModel(reference_host=ref_host, rank_host=rank_host, hosts={})
    host_ranks = {h: sorted(r for r, hh in rank_host.items() if hh == h) for h in hosts}

    if len(hosts) == 1:
        model.hosts[ref_host] = HostClock(host=ref_host, offset_ns=0.0, method="single-host", ranks=host_ranks[ref_host])
    else:
        model.hosts[ref_host] = HostClock(host=ref_host, offset_ns=0.0, method="reference", ranks=host_ranks[ref_host])
    no_samples: list[str] = []
    for h in hosts:
        if h == ref_host:
            continue
        leaders = _leaders(h, host_ranks[h], infos, samples)
        est: dict[int, Table] = {}
        n_samples = 0
        for (r, w), tab in samples.items():
            if r not in leaders:
                continue
            if r in infos and infos[r].reference is not None and "peer" in tab and len(tab["peer"]):
                peer_ok = np.asarray(tab["peer"]) == infos[r].reference
                tab = {k: np.asarray(v)[peer_ok] for k, v in tab.items()}
            e = phase_offsets(tab, keep_fraction=keep_fraction, min_keep=min_keep)
            if len(e["phase"]):
                prev = est.get(w)
                est[w] = e if prev is None else {k: np.concatenate([prev[k], e[k]]) for k in e}
                n_samples += int(e["n"].sum())
        if not est:
            no_samples.append(h)
            continue
        segs, glob = fit_segments(est)
        for w, s in segs.items():
            model.segments[(h, w)] = s
        model.fallback[h] = glob
        first_w = min(segs)
        s0 = segs[first_w]
        model.hosts[h] = HostClock(host=h, offset_ns=s0.offset_ns, drift_ppm=glob.slope * 1e6, t_ref_ns=s0.t_ref_ns,
                                   method="ping-pong", n_samples=n_samples, ranks=host_ranks[h])
        spreads = np.concatenate([e["spread_ns"] for e in est.values()])
        log.debug("host %s: offset %.0f ns, drift %.3f ppm, %d samples, kept spread ≤ %.0f ns", h, s0.offset_ns,
                  glob.slope * 1e6, n_samples, spreads.max(initial=0.0))

    if no_samples:
        _from_collectives(model, no_samples, host_ranks, collectives, names)

    if collectives is not None and len(collectives):
        residuals(model, collectives, names=names)
    return model


def _leaders(host: str, ranks: Sequence[int], infos, samples) -> set[int]:
    """Ranks whose samples give this host's clock: the declared leader(s), else any rank of the host with samples."""
    with_samples = {r for (r, _w) in samples if r in ranks}
    declared = {infos[r].leader for r in ranks if infos[r].leader is not None}
    chosen = with_samples & declared
    return chosen or with_samples


def _sync_instances(c: Collectives, names) -> np.ndarray:
    ok = c.instances["complete"] & c.instances["consistent"]
    if names is not None:
        sync = c.sync_mask(names)
        if (ok & sync).any():
            return ok & sync
    return ok


def _host_ends(c: Collectives, rank_host: Mapping[int, str], use: np.ndarray, host: str) -> tuple[np.ndarray, ...]:
    """Per used instance: median end time of the host's ranks (relative to the instance's min end) and a presence mask.

    Returns (inst ids, rel end median, window) for instances where `host` has ranks.
    """
    m = c.members
    on = np.array([rank_host.get(int(r)) == host for r in np.unique(m["rank"])])
    ranks_u = np.unique(m["rank"])
    on_host = on[np.searchsorted(ranks_u, m["rank"])] & use[m["inst"]]
    inst = m["inst"][on_host]
    if len(inst) == 0:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    rel = (m["end_ns"][on_host] - c.instances["end_min"][inst]).astype(np.float64)
    order = np.lexsort((rel, inst))
    inst, rel = inst[order], rel[order]
    first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    cnt = np.diff(np.r_[first, len(inst)])
    # median per group of a sorted run: mean of the middle one or two
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    med = (rel[lo] + rel[hi]) / 2.0
    ids = inst[first]
    return ids, med, c.instances["window"][ids].astype(np.int64)


def _from_collectives(model: ClockModel, hosts: list[str], host_ranks, c: Collectives | None, names) -> None:
    """Align hosts without samples so that their collective end times match the reference host's (median per window)."""
    ref = model.reference_host
    if c is None or len(c) == 0:
        for h in hosts:
            model.hosts[h] = HostClock(host=h, offset_ns=0.0, method="none", ranks=host_ranks[h])
        model.warnings.append(
            f"no clock-sync samples and no matched collectives for host(s) {', '.join(hosts)}: their times are not "
            "aligned to the reference host (cross-host timings may be off by the clock offset)")
        return
    use = _sync_instances(c, names)
    ref_ids, ref_med, _ = _host_ends(c, model.rank_host, use, ref)
    for h in hosts:
        ids, med, win = _host_ends(c, model.rank_host, use, h)
        common, i_ref, i_h = np.intersect1d(ref_ids, ids, return_indices=True)
        if len(common) == 0:
            model.hosts[h] = HostClock(host=h, offset_ns=0.0, method="none", ranks=host_ranks[h])
            model.warnings.append(
                f"host {h}: no clock-sync samples and no collective shared with the reference host {ref}; "
                "its times are not aligned")
            continue
        # d = end_ref − end_h (instance-relative values, so epoch ns never go through a double)
        d = ref_med[i_ref] - med[i_h]
        w_of = win[i_h]
        t_of = c.instances["end_min"][common] + np.rint(med[i_h]).astype(np.int64)  # this host's clock
        segs = {}
        for w in np.unique(w_of):  # per window
            sel = w_of == w
            ts = np.sort(t_of[sel])
            segs[int(w)] = Segment(int(ts[len(ts) // 2]), float(np.median(d[sel])), 0.0)
        for w, s in segs.items():
            model.segments[(h, w)] = s
        # drift only reported: least-squares line through per-window medians (needs 2 windows)
        ws = sorted(segs)
        drift = 0.0
        if len(ws) >= 2:
            t0 = segs[ws[0]].t_ref_ns
            x = np.array([segs[w].t_ref_ns - t0 for w in ws], dtype=np.float64)
            y = np.array([segs[w].offset_ns for w in ws])
            if np.ptp(x) > 0:
                drift = float(np.polyfit(x, y, 1)[0]) * 1e6
        s0 = segs[ws[0]]
        model.fallback[h] = Segment(s0.t_ref_ns, float(np.median(d)), 0.0)
        model.hosts[h] = HostClock(host=h, offset_ns=s0.offset_ns, drift_ppm=drift, t_ref_ns=s0.t_ref_ns,
                                   method="collectives", n_samples=int(len(common)), ranks=host_ranks[h])
    aligned = [h for h in hosts if model.hosts[h].method == "collectives"]
    if aligned:
        model.warnings.append(
            f"no clock-sync samples for host(s) {', '.join(aligned)} (imported traces or a failed sync): aligned from "
            f"collective end times instead (accuracy ~0.1–1 ms; see the residual per host)")


def residuals(model: ClockModel, c: Collectives, *, names: np.ndarray | None = None) -> dict[str, tuple[float, float]]:
    """Causality check after alignment; fills HostClock.residual_us / residual_max_us. Returns host -> (median, max) µs.

    For each complete, consistent synchronising instance, host h's violation is
    max(0, max_start(all) − min_end(h), max_start(h) − min_end(all)): some rank finished before the last one entered.
    """
    if c is None or len(c) == 0:
        return {}
    a = realign(c, model.align)
    use = _sync_instances(a, names)
    m, ins = a.members, a.instances
    out: dict[str, tuple[float, float]] = {}
    ranks_u = np.unique(m["rank"])
    host_of = np.array([model.rank_host.get(int(r), "") for r in ranks_u], dtype=object)
    mh = host_of[np.searchsorted(ranks_u, m["rank"])]
    for h, hc in model.hosts.items():  # per host
        sel = (mh == h) & use[m["inst"]]
        if not sel.any():
            continue
        inst = m["inst"][sel]
        s, e = m["start_ns"][sel], m["end_ns"][sel]
        order = np.argsort(inst, kind="stable")
        inst, s, e = inst[order], s[order], e[order]
        first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
        ids = inst[first]
        h_smax = np.maximum.reduceat(s, first)
        h_emin = np.minimum.reduceat(e, first)
        v = np.maximum.reduce([np.zeros(len(ids), np.int64), ins["start_max"][ids] - h_emin,
                               h_smax - ins["end_min"][ids]])
        med, mx = float(np.median(v)) / 1e3, float(v.max()) / 1e3
        hc.residual_us, hc.residual_max_us = med, mx
        out[h] = (med, mx)
    return out
