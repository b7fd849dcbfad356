"""Per-event columns of one rank's window -> the shard tables (events, threads, comms, steps). Pure numpy.

Shared by capture (``distprof.capture.extract``) and ``distprof import``. Callers collect the raw columns (in any
order, memory events excluded) and the collective metadata found in event arguments; this module sorts, classifies
(:mod:`distprof.events.classify`), assigns steps, resolves process groups and numbers collectives.

Step of an event: the ``ProfilerStep#N`` span (on the stepping thread) containing its start — except device events
with a correlation id, which take the step of their launch, the runtime call with the same id (a kernel belongs to
the step that issued it, even when it runs after the step's CPU span ended); one whose launch is not in the trace
(launched before the recording began) belongs to no step (−1), as Holistic Trace Analysis has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..storage import schema
from . import classify, p2p
from .p2p import P2P_OPS, P2PCalls
from .classify import CommArgs
from .launches import launch_rows

__all__ = ["Columns", "Built", "build_tables", "Strings", "track_keys"]

#: Ops a kernel's name gives that several collectives share (NCCL runs all_to_all, gather and scatter as SendRecv):
#: the collective named by the op that launched it wins.
GENERIC_KERNEL_OPS = frozenset({"send_recv"})


class Strings:
    """String table under construction: id(s) gives a stable index."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids)
        return i

    def list(self) -> list[str]:
        return list(self.ids)


@dataclass
class Columns:
    """Raw per-event columns (same length, any order); see the /events table for their meaning."""

    name_id: np.ndarray
    kind: np.ndarray
    tid: np.ndarray
    device: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    flops: np.ndarray
    corr: np.ndarray
    msg_bytes: np.ndarray | None = None  # from shapes, -1 unknown
    comm_meta: dict[int, CommArgs] = field(default_factory=dict)  # event index -> metadata from its args


@dataclass
class Built:
    tables: dict[str, dict[str, np.ndarray]]
    process_groups: list[dict[str, Any]]
    order: np.ndarray  # events-table row -> input index
    assign_step: Callable[[np.ndarray], np.ndarray]
    step_span: tuple[np.ndarray, np.ndarray]  # starts, ends of the steps table


def track_keys(device: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct tracks of events: (device, tid) pairs with every CPU event (device < 0) on device −1.

    Returns the tracks' devices and tids, sorted by (device, tid) — CPU threads first — and each event's track index.
    """
    dev = np.where(np.asarray(device) >= 0, np.asarray(device, np.int64), -1)
    tid = np.asarray(tid, np.int64)
    if len(tid) == 0:
        return np.zeros(0, np.int16), np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.lexsort((tid, dev))
    ds, ts_ = dev[o], tid[o]
    new = np.r_[True, (ds[1:] != ds[:-1]) | (ts_[1:] != ts_[:-1])]
    idx = np.cumsum(new) - 1
    inv = np.empty(len(tid), np.int64)
    inv[o] = idx
    return ds[new].astype(np.int16), ts_[new], inv


_CHUNK = 1 << 16  # events per block where a per-event computation would otherwise need several full-size temporaries


def _step_assigner(step_ids: np.ndarray, s_start: np.ndarray, s_end: np.ndarray):
    def assign_block(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s_start, t, side="right") - 1
        ok = (k >= 0) & (t < s_end[np.clip(k, 0, None)])
        return np.where(ok, step_ids[np.clip(k, 0, None)], -1).astype(np.int32)

    def assign(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t)
        if len(step_ids) == 0:
            return np.full(len(t), -1, np.int32)
        if len(t) <= _CHUNK:
            return assign_block(t)
        out = np.empty(len(t), np.int32)
        for s in range(0, len(t), _CHUNK):
            out[s:s + _CHUNK] = assign_block(t[s:s + _CHUNK])
        return out

    return assign


def _tracks(device: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (device, tid) tracks of :func:`track_keys`, sorted the same way, without its per-event arrays:
    distinct pairs are found block by block (few tracks, many events), then merged."""
    dev_parts, tid_parts = [], []
    for s in range(0, len(tid), _CHUNK):
        d = np.asarray(device[s:s + _CHUNK])
        d = np.where(d >= 0, d.astype(np.int64), -1)
        t = np.asarray(tid[s:s + _CHUNK], np.int64)
        o = np.lexsort((t, d))
        ds, ts_ = d[o], t[o]
        new = np.r_[True, (ds[1:] != ds[:-1]) | (ts_[1:] != ts_[:-1])]
        dev_parts.append(ds[new])
        tid_parts.append(ts_[new])
    if not dev_parts:
        return np.zeros(0, np.int16), np.zeros(0, np.int64)
    ds, ts_ = np.concatenate(dev_parts), np.concatenate(tid_parts)
    o = np.lexsort((ts_, ds))
    ds, ts_ = ds[o], ts_[o]
    new = np.r_[True, (ds[1:] != ds[:-1]) | (ts_[1:] != ts_[:-1])]
    return ds[new].astype(np.int16), ts_[new]


def _launch_context(ev_ts, ev_tid, ev_dur, ev_corr, ev_kind, ev_dev, ev_role, targets) -> dict[int, list[int]]:
    """events-row of a device kernel -> events-rows of the communication ops (``comms`` role enqueue or annotation:
    ``c10d::*``, ``nccl:*``, ``record_param_comms``) around its launch (``launches.launch_rows``, launching thread),
    innermost first, for the kernels of `targets` launched inside one."""
    ops = np.flatnonzero((ev_role == schema.ROLE_ENQUEUE) | (ev_role == schema.ROLE_ANNOTATION))
    ops = ops[ev_kind[ops] != schema.KIND_CODE["kernel"]]
    if len(targets) == 0 or len(ops) == 0:
        return {}
    launch = launch_rows(ev_kind, ev_dev, ev_corr, targets)
    ok = launch >= 0
    kernels, lrows = targets[ok], launch[ok]
    out: dict[int, list[int]] = {}
    for t in np.unique(ev_tid[ops]).tolist():
        mine = ops[ev_tid[ops] == t]
        mine = mine[np.lexsort((-(ev_ts[mine] + ev_dur[mine]), ev_ts[mine]))]  # by start, the outer one first
        starts, ends = ev_ts[mine], ev_ts[mine] + ev_dur[mine]
        reach = np.maximum.accumulate(ends)  # a launch before every later op's start and past `reach` is outside
        sel = np.flatnonzero(ev_tid[lrows] == t)
        at = ev_ts[lrows[sel]]
        k = np.searchsorted(starts, at, side="right") - 1
        inside = (k >= 0) & (reach[np.maximum(k, 0)] > at)
        for i, kk in zip(sel[inside].tolist(), k[inside].tolist()):  # few: launches inside communication ops
            a = int(ev_ts[lrows[i]])
            chain = []  # latest start first: innermost; `reach` never falls, so once reach <= a no earlier op holds a
            x = kk
            while x >= 0 and reach[x] > a:
                if starts[x] <= a < ends[x]:
                    chain.append(int(mine[x]))
                x -= 1
            if chain:
                out[int(kernels[i])] = chain
    return out


def _p2p_peers(calls: P2PCalls | None, c_rows, is_p2p, is_recv, ev_ts, ev_tid, ev_dev, ctx, c_pg,
               pg_index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Peer (global rank, −1 unknown) and transfer number (−1 unknown) of each comms row; sets the group of
    point-to-point rows from their call."""
    peer = np.full(len(c_rows), -1, np.int32)
    seq = np.full(len(c_rows), -1, np.int64)
    sel = np.flatnonzero(is_p2p)
    if calls is None or not len(calls) or not sel.size:
        return peer, seq
    rows = c_rows[sel]
    host = ev_dev[rows] < 0
    call = np.full(sel.size, -1, np.int64)
    call[host] = p2p.join(calls, ev_ts[rows[host]], ev_tid[rows[host]], is_recv[sel[host]])
    by_row = {int(r): int(c) for r, c in zip(rows[host].tolist(), call[host].tolist()) if c >= 0}
    for i in np.flatnonzero(~host).tolist():  # a send/recv kernel: the call of the op that launched it
        call[i] = next((by_row[a] for a in ctx.get(int(rows[i]), ()) if a in by_row), -1)
    ok = call >= 0
    peer[sel[ok]] = calls.peer[call[ok]]
    seq[sel[ok]] = calls.seq[call[ok]]
    for j, c in zip(sel[ok].tolist(), call[ok].tolist()):
        g = pg_index.get(str(calls.pg[c]))
        if g is not None:
            c_pg[j] = g
    return peer, seq


def _in_order(a: Any, dtype: Any, order: np.ndarray | None) -> np.ndarray:
    """Input column `a` as `dtype`, taken by `order` (None: as it is)."""
    a = np.asarray(a, dtype)
    return a if order is None else a[order]


@dataclass
class _Sorted:
    """One window's event columns in the events table's order (the input stably sorted by ts)."""

    order: np.ndarray | None  # events-table row -> input index; None when the input is sorted already (the identity)
    name: np.ndarray
    kind: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    tid: np.ndarray
    dev: np.ndarray
    corr: np.ndarray

    def sort(self, a: Any, dtype: Any) -> np.ndarray:
        """Input column `a` as `dtype`, in the events table's order."""
        return _in_order(a, dtype, self.order)


def _sorted_columns(cols: Columns) -> _Sorted:
    """The columns the events table holds: the input's, sorted by ts (stable) unless they already are."""
    in_ts = np.asarray(cols.ts, np.int64)
    # columns already sorted by ts (distprof import sorts them in place): the stable order is the identity, and the
    # events table takes the columns as they are instead of a sorted copy of each (half the memory)
    presorted = len(in_ts) < 2 or bool(np.all(in_ts[1:] >= in_ts[:-1]))
    # (presorted: the identity order is only made at the end, when build_tables' temporaries are gone)
    order = None if presorted else np.argsort(in_ts, kind="stable")
    return _Sorted(order, name=_in_order(cols.name_id, np.uint32, order),
                   kind=_in_order(np.asarray(cols.kind, np.uint8), np.uint8, order),
                   ts=_in_order(in_ts, np.int64, order), dur=_in_order(cols.dur, np.int64, order),
                   tid=_in_order(cols.tid, np.int64, order), dev=_in_order(cols.device, np.int16, order),
                   corr=_in_order(cols.corr, np.int64, order))


def _roles(ev: _Sorted, names: list[str]) -> tuple[np.ndarray, dict[int, list[int]], set[int]]:
    """Communication role of each event (classified once per distinct (name, is-kernel)), the communication ops
    around each kernel's launch (:func:`_launch_context`), and the kernels that take their role from those alone."""
    k_kernel = schema.KIND_CODE["kernel"]
    role_plain = np.array([classify.comm_role(s) for s in names], dtype=np.uint8)
    role_kernel = np.array([classify.comm_role(s, k_kernel) for s in names], dtype=np.uint8)
    ev_role = np.where(ev.kind == k_kernel, role_kernel[ev.name] if names else 0,
                       role_plain[ev.name] if names else 0).astype(np.uint8)
    # a kernel launched inside a communication op executes it, whatever its name (renamed or custom collectives)
    ctx = _launch_context(ev.ts, ev.tid, ev.dur, ev.corr, ev.kind, ev.dev, ev_role,
                          np.flatnonzero((ev.kind == k_kernel) & (ev.dev >= 0) & (ev.corr != 0)))
    by_context = np.array([k for k in ctx if ev_role[k] == 0], dtype=np.int64)
    ev_role[by_context] = schema.ROLE_EXEC
    return ev_role, ctx, set(by_context.tolist())


def _step_spans(ev: _Sorted, names: list[str], main_tid: int | None,
                step_end_ns: Mapping[int, int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step ids, starts, ends) of the ``ProfilerStep#N`` spans on the stepping thread (`main_tid`, else the thread
    with most of them), sorted by start; ends capped by `step_end_ns`, steps left with no iteration dropped."""
    is_step_name = np.array([s.startswith("ProfilerStep#") for s in names], dtype=bool)
    step_rows = np.flatnonzero(is_step_name[ev.name]) if names else np.zeros(0, np.int64)
    step_rows = step_rows[ev.dev[step_rows] < 0]
    main_rows = step_rows[ev.tid[step_rows] == main_tid] if main_tid is not None else step_rows[:0]
    if len(main_rows) == 0 and len(step_rows):
        vals, counts = np.unique(ev.tid[step_rows], return_counts=True)
        main_rows = step_rows[ev.tid[step_rows] == vals[np.argmax(counts)]]
    step_ids = np.array([int(names[ev.name[r]].split("#", 1)[1]) for r in main_rows], dtype=np.int32)
    s_start = ev.ts[main_rows]
    s_end = s_start + ev.dur[main_rows]
    srt = np.argsort(s_start, kind="stable")
    step_ids, s_start, s_end = step_ids[srt], s_start[srt], s_end[srt]
    if step_end_ns and len(step_ids):
        capped = np.array([int(k) in step_end_ns for k in step_ids.tolist()], dtype=bool)
        cap = np.array([int(step_end_ns.get(int(k), 0)) for k in step_ids.tolist()], dtype=np.int64)
        s_end = np.where(capped, np.minimum(s_end, cap), s_end)
        keep = ~capped | (s_end > s_start)
        step_ids, s_start, s_end = step_ids[keep], s_start[keep], s_end[keep]
    return step_ids, s_start, s_end


def _event_steps(ev: _Sorted, assign: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Step of each event: the step span holding its start; a device event with a correlation id takes its launch's
    (−1 when the launch is not in the trace)."""
    ev_step = assign(ev.ts)
    on_dev = np.flatnonzero((ev.dev >= 0) & (ev.corr != 0))
    if len(on_dev):
        lrow = launch_rows(ev.kind, ev.dev, ev.corr, on_dev)
        ok = lrow >= 0
        ev_step[on_dev[ok]] = ev_step[lrow[ok]]
        ev_step[on_dev[~ok]] = -1  # launched before the recording began: its launch is not in the trace
    return ev_step


@dataclass
class _Groups:
    """The window's process groups: the list returned (grown on import), name -> index, and the group of a
    communication row (or thread) that names none."""

    pgs: list[dict[str, Any]]
    index: dict[str, int]
    default: int
    add: bool  # a group named in an event's arguments but not listed is appended (import), else ignored

    @classmethod
    def of(cls, process_groups: list[dict[str, Any]] | None, add: bool) -> _Groups:
        """The groups as given; the default is the only gloo group, else the only group, else none (−1)."""
        pgs = [dict(p) for p in (process_groups or [])]
        index = {str(p["name"]): int(p["index"]) for p in pgs}
        gloo_pgs = [p for p in pgs if "gloo" in str(p.get("backend", ""))]
        default = int(gloo_pgs[0]["index"]) if len(gloo_pgs) == 1 else (0 if len(pgs) == 1 else -1)
        return cls(pgs, index, default, add)

    def named(self, a: CommArgs, otherwise: int) -> int:
        """Index of the group `a` names (appended first when new and groups are added), else `otherwise`."""
        if a.pg_name not in self.index and self.add:
            self.index[a.pg_name] = len(self.pgs)
            self.pgs.append({"index": len(self.pgs), "name": a.pg_name, "desc": a.pg_desc or "",
                             "backend": "", "ranks": list(a.pg_ranks or [])})
        return self.index.get(a.pg_name, otherwise)


def _threads_table(u_dev: np.ndarray, uniq_tids: np.ndarray, strings: Strings, groups: _Groups, *,
                   main_tid: int | None, thread_names: Mapping[int, str] | None,
                   stream_names: Mapping[tuple[int, int], str] | None,
                   gloo_thread_pg: Mapping[int, str] | None) -> dict[str, np.ndarray]:
    """The threads table: one row per track (:func:`_tracks`), named, with its role and (comm threads) its group."""
    tpg = dict(gloo_thread_pg or {})
    tnames = dict(thread_names or {})
    snames = dict(stream_names or {})
    t_role = np.zeros(len(uniq_tids), np.uint8)
    t_pg = np.full(len(uniq_tids), -1, np.int32)
    t_name = np.zeros(len(uniq_tids), np.uint32)
    for j, (d, t) in enumerate(zip(u_dev.tolist(), uniq_tids.tolist())):
        if d >= 0:
            t_role[j] = schema.THREAD_STREAM
            tname = snames.get((d, t), "") or f"stream {t}"
        else:
            tname = tnames.get(t, "")
            if main_tid is not None and t == main_tid:
                t_role[j] = schema.THREAD_MAIN
            elif tname == "pt_gloo_runloop" or t in tpg:
                t_role[j] = schema.THREAD_COMM
                t_pg[j] = groups.index.get(tpg.get(t, ""), groups.default)
        t_name[j] = strings.id(tname or f"thread {t}")
    return {"tid": uniq_tids.astype(np.int64), "device": u_dev.astype(np.int16), "name_id": t_name,
            "role": t_role, "pg": t_pg}


def _comm_meta(cols: Columns, ev: _Sorted, names: list[str], c_rows: np.ndarray, c_role: np.ndarray,
               ctx: dict[int, list[int]], context_rows: set[int]) -> dict[int, CommArgs]:
    """events-row -> collective arguments: the input's (re-keyed to the sorted rows); a device kernel's merged with
    those of the ops around its launch, innermost first, and naming the collective the launching op names."""
    if ev.order is None or not cols.comm_meta:
        meta: dict[int, CommArgs] = dict(cols.comm_meta)
    else:
        inv = np.empty(len(ev.order), np.int64)
        inv[ev.order] = np.arange(len(ev.order))
        meta = {int(inv[i]): a for i, a in cols.comm_meta.items()}
        del inv
    for k in c_rows[(c_role == schema.ROLE_EXEC) & (ev.dev[c_rows] >= 0)].tolist():
        chain = ctx.get(k)
        if chain is None:
            continue
        own = meta.get(k) or CommArgs()
        for a in chain:  # the kernel's own arguments, then those of the ops around its launch, innermost first
            own = own.merged(meta.get(a))
        if own.op is None:  # the collective the launching op names (a SendRecv kernel of an all_to_all is one)
            outer = next((op for op in (classify.normalize_op(names[ev.name[a]]) for a in chain) if op), None)
            mine = classify.normalize_op(names[ev.name[k]])
            if outer and (k in context_rows or mine in GENERIC_KERNEL_OPS):
                own = own.merged(CommArgs(op=outer))
        meta[k] = own
    return meta


@dataclass
class _CommFields:
    """Per comms row: what its name and arguments give (−1 unknown), before peers, default groups and numbering."""

    op: np.ndarray  # string id of the collective's op
    pg: np.ndarray
    bytes: np.ndarray
    group_size: np.ndarray
    nccl_seq: np.ndarray
    seq_ok: np.ndarray  # numbered into its group's collective sequence (not a library kernel, not point-to-point)
    is_p2p: np.ndarray
    recv: np.ndarray


def _comm_fields(cols: Columns, ev: _Sorted, names: list[str], strings: Strings, c_rows: np.ndarray,
                 meta: dict[int, CommArgs], groups: _Groups, c_pg: np.ndarray) -> _CommFields:
    """Op, group (`c_pg`: the track's, updated in place), bytes, group size and NCCL sequence of each comms row,
    from its name (classified once per distinct name) and its collective arguments."""
    n_c = len(c_rows)
    if cols.msg_bytes is not None:
        c_bytes = np.asarray(cols.msg_bytes)[c_rows if ev.order is None else ev.order[c_rows]].astype(np.int64)
    else:
        c_bytes = np.full(n_c, -1, np.int64)
    c_op = np.zeros(n_c, np.uint32)
    c_gsize = np.full(n_c, -1, np.int32)
    c_nseq = np.full(n_c, -1, np.int64)
    seq_ok = np.ones(n_c, bool)
    c_is_p2p = np.zeros(n_c, bool)
    c_recv = np.zeros(n_c, bool)
    op_cache: dict[int, tuple[str, bool]] = {}
    for j, r in enumerate(c_rows.tolist()):
        nid = int(ev.name[r])
        hit = op_cache.get(nid)
        if hit is None:
            nm = names[nid]
            op = classify.normalize_op(nm)
            lib = not op and bool(classify.comm_kernel_op(nm))
            hit = op_cache[nid] = (op or classify.comm_kernel_op(nm) or nm, lib)
        op, lib = hit
        seq_ok[j] = not lib  # library kernels (DeepEP, NVSHMEM, ...) are not numbered into a process group
        a = meta.get(r)
        if a is not None:
            if a.op:
                op = a.op
            if a.pg_name is not None:
                c_pg[j] = groups.named(a, c_pg[j])
            if a.bytes is not None:
                c_bytes[j] = a.bytes
            if a.group_size is not None:
                c_gsize[j] = a.group_size
            if a.nccl_seq is not None:
                c_nseq[j] = a.nccl_seq
        c_op[j] = strings.id(op)
        if op in P2P_OPS:
            seq_ok[j] = False
            c_is_p2p[j] = True
            c_recv[j] = op == "recv"
    return _CommFields(op=c_op, pg=c_pg, bytes=c_bytes, group_size=c_gsize, nccl_seq=c_nseq, seq_ok=seq_ok,
                       is_p2p=c_is_p2p, recv=c_recv)


def _collective_seq(c_rows: np.ndarray, c_role: np.ndarray, seq_ok: np.ndarray, c_pg: np.ndarray,
                    ev_ts: np.ndarray) -> np.ndarray:
    """Sequence number of each numbered exec row within its process group, by start time (−1 for the others)."""
    c_seq = np.full(len(c_rows), -1, np.int32)
    ex = np.flatnonzero((c_role == schema.ROLE_EXEC) & seq_ok)
    if len(ex):
        srt = ex[np.lexsort((ev_ts[c_rows[ex]], c_pg[ex]))]
        pg_sorted = c_pg[srt]
        starts = np.r_[0, np.flatnonzero(np.diff(pg_sorted)) + 1]
        group_first = np.repeat(starts, np.diff(np.r_[starts, len(srt)]))
        c_seq[srt] = (np.arange(len(srt)) - group_first).astype(np.int32)
    return c_seq


def _comms_table(cols: Columns, ev: _Sorted, names: list[str], strings: Strings, ev_role: np.ndarray,
                 ctx: dict[int, list[int]], context_rows: set[int], groups: _Groups, threads: dict[str, np.ndarray],
                 p2p_calls: P2PCalls | None) -> dict[str, np.ndarray]:
    """The comms table: one row per event with a communication role, its collective's op, group, size and number."""
    c_rows = np.flatnonzero(ev_role > 0)
    c_role = ev_role[c_rows]
    meta = _comm_meta(cols, ev, names, c_rows, c_role, ctx, context_rows)
    track_of = {(d, t): j for j, (d, t) in enumerate(zip(threads["device"].tolist(), threads["tid"].tolist()))}
    c_track = np.array([track_of[(d if d >= 0 else -1, t)] for d, t in zip(ev.dev[c_rows].tolist(),
                                                                           ev.tid[c_rows].tolist())], np.int64)
    c_pg = threads["pg"][c_track] if len(c_rows) else np.zeros(0, np.int32)
    f = _comm_fields(cols, ev, names, strings, c_rows, meta, groups, c_pg)
    c_peer, c_p2p_seq = _p2p_peers(p2p_calls, c_rows, f.is_p2p, f.recv, ev.ts, ev.tid, ev.dev, ctx, c_pg,
                                   groups.index)
    if len(c_rows):
        c_pg[c_pg < 0] = groups.default
    size_by_pg = {int(p["index"]): len(p.get("ranks") or []) for p in groups.pgs}
    for j in np.flatnonzero(f.group_size < 0).tolist():
        f.group_size[j] = size_by_pg.get(int(c_pg[j]), 0) or -1
    return {
        "row": c_rows.astype(np.int64),
        "op_id": f.op,
        "role": c_role.astype(np.uint8),
        "pg": c_pg.astype(np.int32),
        "seq": _collective_seq(c_rows, c_role, f.seq_ok, c_pg, ev.ts),
        "bytes": f.bytes,
        "group_size": f.group_size,
        "nccl_seq": f.nccl_seq,
        "peer": c_peer,
        "p2p_seq": c_p2p_seq,
    }


def _steps_table(step_ids: np.ndarray, s_start: np.ndarray, s_end: np.ndarray, ev_step: np.ndarray,
                 flops: np.ndarray) -> dict[str, np.ndarray]:
    """The steps table: span, event count and FLOPs of each step (peak memory and CPU columns left for the caller)."""
    n_steps = len(step_ids)
    step_count = np.zeros(n_steps, np.int64)
    step_flops = np.zeros(n_steps, np.float64)
    if n_steps:
        # per distinct step value (ev_step holds step ids or -1), then the events with flops only (adding 0.0
        # changes no float sum, so the totals are those of a sum over every event)
        vals, counts = np.unique(ev_step, return_counts=True)
        slot = np.searchsorted(step_ids, vals)
        ok = (vals >= 0) & (slot < n_steps)
        ok[ok] = step_ids[slot[ok]] == vals[ok]
        np.add.at(step_count, slot[ok], counts[ok])
        rows = np.flatnonzero(flops)
        rows = rows[ev_step[rows] >= 0]
        fslot = np.searchsorted(step_ids, ev_step[rows])
        fok = fslot < n_steps
        fok[fok] = step_ids[fslot[fok]] == ev_step[rows][fok]
        step_flops = np.bincount(fslot[fok], weights=flops[rows][fok].astype(np.float64), minlength=n_steps)
    return {
        "step": step_ids.astype(np.int32),
        "start_ns": s_start.astype(np.int64),
        "end_ns": s_end.astype(np.int64),
        "flops": np.rint(step_flops).astype(np.int64),
        "peak_mem_bytes": np.zeros(n_steps, np.int64),
        "n_events": step_count.astype(np.int64),
        "cpu_run_ns": np.full(n_steps, -1, np.int64),  # unknown here: the capture fills them (capture/schedstat.py)
        "cpu_wait_ns": np.full(n_steps, -1, np.int64),
        "cpu_wait_opt_ns": np.full(n_steps, -1, np.int64),
        "page_faults": np.full(n_steps, -1, np.int64),
    }


def build_tables(
    cols: Columns,
    strings: Strings,
    *,
    main_tid: int | None,
    thread_names: Mapping[int, str] | None = None,
    stream_names: Mapping[tuple[int, int], str] | None = None,
    gloo_thread_pg: Mapping[int, str] | None = None,
    process_groups: list[dict[str, Any]] | None = None,
    add_process_groups: bool = False,
    p2p_calls: P2PCalls | None = None,
    step_end_ns: Mapping[int, int] | None = None,
    step_spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> Built:
    """Sort, classify and tabulate one window. Returns the events, threads, comms and steps tables.

    `step_end_ns` (capture): step id -> when its iteration finished, for steps whose ``ProfilerStep#N`` span was ended
    by something else than the next iteration (the window closing after the loop): such a step ends there instead,
    so what followed (a checkpoint, teardown) is in no step (−1). It only ever shortens a step; a step whose end
    there is not after its start had no iteration in it (the tail after the last one) and is left out.

    `step_spans` (import, a trace without ``ProfilerStep#N``: :mod:`distprof.importers.units`): the steps as (ids,
    starts, ends), sorted by start and not overlapping, used instead of the ``ProfilerStep#N`` spans.

    A ``Process Group Name`` in an event's arguments selects that group; one not in `process_groups` is appended to
    the returned list when `add_process_groups` (import), else ignored (capture: the shard's list is fixed).

    Threads table: one row per OS thread (``device`` −1, `thread_names` by tid) and per device stream (``device`` ≥ 0,
    ``tid`` = stream id, `stream_names` by (device, stream), default ``stream S``).

    Point-to-point (``send``/``recv``) rows take their peer and group from `p2p_calls` (:mod:`.p2p`) and are not
    numbered into their group's collective sequence (``seq`` −1): they are matched sender to receiver, not as
    collectives.
    """
    names = strings.list()
    ev = _sorted_columns(cols)
    ev_role, ctx, context_rows = _roles(ev, names)
    category = classify.categorize(ev.kind, ev_role)
    if step_spans is None:
        step_ids, s_start, s_end = _step_spans(ev, names, main_tid, step_end_ns)
    else:
        step_ids, s_start, s_end = (np.asarray(a, t) for a, t in zip(step_spans, (np.int32, np.int64, np.int64)))
    assign = _step_assigner(step_ids, s_start, s_end)
    ev_step = _event_steps(ev, assign)
    events = {"name_id": ev.name, "kind": ev.kind, "category": category, "tid": ev.tid, "device": ev.dev,
              "ts_ns": ev.ts, "dur_ns": ev.dur, "step": ev_step, "flops": ev.sort(cols.flops, np.int64),
              "corr_id": ev.corr}
    groups = _Groups.of(process_groups, add_process_groups)
    # one row per track: an OS thread (device -1) or a device stream, keyed by (device, stream) so stream 7 of
    # GPU 0 and stream 7 of GPU 1 stay two tracks
    threads = _threads_table(*_tracks(ev.dev, ev.tid), strings, groups, main_tid=main_tid, thread_names=thread_names,
                             stream_names=stream_names, gloo_thread_pg=gloo_thread_pg)
    comms = _comms_table(cols, ev, names, strings, ev_role, ctx, context_rows, groups, threads, p2p_calls)
    steps = _steps_table(step_ids, s_start, s_end, ev_step, events["flops"])
    order = np.arange(len(ev.ts)) if ev.order is None else ev.order
    return Built(tables={"events": events, "comms": comms, "threads": threads, "steps": steps},
                 process_groups=groups.pgs, order=order, assign_step=assign, step_span=(s_start, s_end))
