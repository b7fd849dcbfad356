"""Stragglers and root cause on hand-built DDP-like runs (2 bucket all-reduces per step, like real DDP)."""

from __future__ import annotations

import distprof
import numpy as np
import pytest
from test_breakdown import ddp_run

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.types import HostClock
from distprof.analysis.cross.rootcause import IDLE_NAME, root_cause
from distprof.analysis.cross.stragglers import StragglerRule, collective_instances, find_stragglers

JITTER = (0.0, 0.1, 0.2, 0.3)  # ms: rank r arrives r·0.1 ms after rank 0 when nobody is slowed


def _by_rank(res):
    return {d.rank: d for d in res.ranks}


def test_instances_and_lateness():
    run = ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER)
    t = collective_instances(summarize_merged(run))
    assert t["inst"].max() + 1 == 6  # 3 steps × 2 buckets
    assert np.all(t["n_ranks"] == 4)
    lat = t["lateness_ns"] / 1e6
    # arrivals (ms after rank 0) 0, 0.1, 20.2, 0.3 at every bucket all-reduce; lateness = own − median of the others
    assert lat[t["rank"] == 2] == pytest.approx([20.2 - 0.1] * 6)
    assert lat[t["rank"] == 0] == pytest.approx([0.0 - 0.3] * 6)
    assert lat[t["rank"] == 3] == pytest.approx([0.3 - 0.1] * 6)
    assert t["behind_first_ns"][t["rank"] == 2] / 1e6 == pytest.approx([20.2] * 6)
    assert t["lead_ns"][t["rank"] == 2] / 1e6 == pytest.approx([20.2 - 0.3] * 6)
    assert np.all(t["rank"][t["is_last"]] == 2)


def test_the_analysis_holds_only_the_instance_columns_it_reads():
    """find_stragglers asks for its columns only (six fewer: 44 MB at 1,024 LLM-shaped ranks); they are the full
    table's, bit for bit, and its result is the one the full table gives."""
    from distprof.analysis.cross.stragglers import find as F
    from distprof.analysis.cross.stragglers.instances import ANALYSIS_COLUMNS

    run = summarize_merged(ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER))
    full = collective_instances(run)
    part = collective_instances(run, columns=ANALYSIS_COLUMNS)
    assert set(part) == ANALYSIS_COLUMNS and {"pg", "seq", "pos", "n_ranks", "lead_ns", "dur_ns"} <= set(full)
    for k, v in part.items():
        assert v.dtype == full[k].dtype and v.tobytes() == full[k].tobytes(), k
    real = F.collective_instances
    F.collective_instances = lambda r, columns=None: real(r)  # the analysis on the full table
    try:
        want = find_stragglers(run)
    finally:
        F.collective_instances = real
    assert repr(find_stragglers(run)) == repr(want)


def test_late_rank_is_named_with_hand_computed_figures():
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER)))
    assert res.info.named == [2]
    top = res.ranks[0]
    assert top.rank == 2
    # one 20 ms delay before backward delays both bucket all-reduces: the lateness is the delay, not twice it
    assert top.lateness_ms == pytest.approx(20.1)
    assert top.late_fraction == 1.0 and top.late_step_fraction == 1.0
    # blame: each waiting rank's two overlapping bucket waits, as one union per step — rank 0 waits from its first
    # arrival (0) to rank 2's second (25.26: buckets 5.06 ms apart), rank 1 from 0.1, rank 3 from 0.3
    assert top.blame_ms_per_step == pytest.approx(25.26 + 25.16 + 24.96)
    assert top.blame_ms == pytest.approx(3 * top.blame_ms_per_step)
    r = _by_rank(res)
    assert r[0].wait_ms_per_step == pytest.approx(25.26) and r[3].wait_ms_per_step == pytest.approx(24.96)
    assert top.cost_ms_per_step == pytest.approx(19.9)  # vs the second-latest arrival (rank 3)
    # clock-free: durations only (all end together): median of the others' durations − own
    assert top.clock_free_lateness_ms == pytest.approx(20.1)
    assert r[0].blame_ms == 0 and r[0].late_fraction == 0
    assert top.extra_work_ms is None  # no CPU samples
    assert res.info.clock_free.agrees is True
    assert res.info.clock_free.named_confirmed == {"2": True}
    assert [p.rank for p in res.info.per_step] == [2, 2, 2]
    assert res.info.changes == []
    assert res.info.rule.threshold_ms == pytest.approx(1.0)
    cells = res.info.cells
    assert cells.rank == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 and cells.step == [10, 11, 12] * 4
    assert cells.lateness_ms[6:9] == pytest.approx([20.1] * 3)


def test_no_delay_names_nobody():
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, jitter_ms=JITTER)))
    assert res.info.named == []
    # the ranking still exists: rank 3 arrives last, 0.2 ms after the median of the others
    assert res.ranks[0].rank == 3
    assert res.ranks[0].lateness_ms == pytest.approx(0.2)
    assert all(p.rank is None for p in res.info.per_step)


def test_threshold_from_clock_residual():
    run = ddp_run(4, n_steps=3, late_rank=1, late_ms=5, jitter_ms=JITTER)
    run.clock = {"host0": HostClock("host0", 0.0, residual_us=2000.0)}
    res = find_stragglers(summarize_merged(run))
    assert res.info.rule.threshold_ms == pytest.approx(6.0)  # 3 × 2 ms residual
    assert res.info.named == []  # 5.1 ms late: indistinguishable from clock error
    res = find_stragglers(summarize_merged(run), rule=StragglerRule(residual_factor=1.0))
    assert res.info.named == [1]


def test_straggler_changes_between_steps():
    late = {(0, 2): 20.0, (1, 2): 20.0, (2, 1): 15.0, (3, 2): 20.0, (4, 2): 20.0, (5, 1): 15.0}
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=6, late_at=late, jitter_ms=JITTER)))
    assert [p.rank for p in res.info.per_step] == [2, 2, 1, 2, 2, 1]
    assert [c.to_rank for c in res.info.changes] == [1, 2, 1]
    # rank 2 is last in 8 of 12 instances; rank 1 in 4
    r = _by_rank(res)
    assert r[2].late_fraction == pytest.approx(8 / 12)
    assert r[1].late_fraction == pytest.approx(4 / 12)
    # rank 2 is late in 4 of its 6 steps, fewer than the rule's 75 %: not named, but it leads the table
    assert r[2].late_step_fraction == pytest.approx(4 / 6) and r[1].late_step_fraction == pytest.approx(2 / 6)
    assert res.info.named == []
    assert res.ranks[0].rank == 2


def test_late_in_three_of_four_steps_is_named():
    late = {(s, 2): 20.0 for s in (0, 1, 3)}
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=4, late_at=late, jitter_ms=JITTER)))
    assert res.info.named == [2] and res.ranks[0].late_step_fraction == pytest.approx(0.75)


def test_late_in_one_of_three_steps_is_not_named():
    # 20 ms late once in 3 steps, however far out: not consistent across steps
    late = {(1, 2): 20.0}
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, late_at=late, jitter_ms=JITTER)))
    assert [p.rank for p in res.info.per_step] == [None, 2, None]
    assert res.info.named == []
    assert _by_rank(res)[2].late_step_fraction == pytest.approx(1 / 3)


def test_slow_host_names_all_its_ranks():
    run = ddp_run(4, n_steps=3, late_at={(s, r): 20.0 for s in range(3) for r in (2, 3)}, jitter_ms=JITTER,
                  hosts=["nodeA", "nodeA", "nodeB", "nodeB"])
    res = find_stragglers(summarize_merged(run))
    assert sorted(res.info.named) == [2, 3]  # rank 2 is never last, but always 20.2 ms late
    hosts = {h.host: h for h in res.info.hosts}
    assert hosts["nodeB"].named and not hosts["nodeA"].named
    assert hosts["nodeB"].lateness_ms == pytest.approx(20.3 - 0.1)  # its last rank vs node A's last
    assert hosts["nodeB"].late_fraction == 1.0
    assert res.info.hosts[0].host == "nodeB"


def test_no_collectives():
    run = ddp_run(2, n_steps=1)
    run.comms = {k: v[:0] for k, v in run.comms.items()}
    res = find_stragglers(summarize_merged(run))
    assert res.info.n_instances == 0 and res.ranks == [] and res.info.named == []


# idle: rank 2 also starts its forward 0.2 ms into the step (jitter) vs the others' median 0.1 ms -> 20.1
@pytest.mark.parametrize("kind,name,excess", [("compute", "aten::slow", 20.0), ("idle", IDLE_NAME, 20.1)])
def test_root_cause(kind, name, excess):
    run = ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER, late_kind=kind)
    (rc,) = root_cause(summarize_merged(run), [2])
    assert rc.rank == 2 and rc.n_steps == 3
    top = rc.ops[0]
    assert top.name == name
    assert top.excess_ms_per_step == pytest.approx(excess)
    assert top.excess_ms == pytest.approx(3 * excess)
    # communication is an effect, never a cause
    assert all(not op.name.startswith(("gloo:", "c10d::")) for op in rc.ops)


def test_root_cause_is_the_same_in_chunks_of_one_name(monkeypatch):
    """Names are compared a chunk at a time (bounded memory at any rank count): chunks of a single name give the
    same root causes, the [idle] pseudo-op included, as one chunk of all of them."""
    from distprof.analysis.cross import rootcause

    run = summarize_merged(ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER, late_kind="compute",
                                   batch={1: 1.5}))
    whole = root_cause(run, [2, 1])
    monkeypatch.setattr(rootcause, "_CHUNK_CELLS", 1)
    assert root_cause(run, [2, 1]) == whole
    assert {op.name for op in whole[0].ops} >= {"aten::slow"} and {op.name for op in whole[1].ops} >= {"aten::mm"}


def test_root_cause_slower_compute():
    run = ddp_run(4, n_steps=2, batch={1: 1.5}, jitter_ms=JITTER)
    (rc,) = root_cause(summarize_merged(run), [1])
    names = [op.name for op in rc.ops]
    # forward addmm 10 -> 15 ms, backward mm 2×5 -> 2×7.5; the annotation around the addmm is not slower itself:
    # self times, so that the +5 ms is listed once
    assert set(names[:2]) == {"aten::addmm", "aten::mm"}
    ex = {op.name: op.excess_ms_per_step for op in rc.ops}
    assert ex.get("DistributedDataParallel.forward", 0.0) < 0.5
    assert ex["aten::addmm"] == pytest.approx(5.0)
    assert ex["aten::mm"] == pytest.approx(5.0)
    assert sum(ex.values()) < 10.5  # nothing counted twice


def test_synthetic_shards_with_serialised_buckets(tmp_path):
    """A's shard factory: the 2nd bucket waits for the worker busy in the 1st, clocks offset and drifting."""
    from synth import make_run

    syn = make_run(tmp_path, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2, late_ms=30,
                   schedule={"wait": 1, "warmup": 1, "active": 4})
    res = find_stragglers(distprof.load(syn.run_dir))
    assert res.info.named == [2]
    top = res.ranks[0]
    assert top.rank == 2
    assert top.lateness_ms == pytest.approx(30, rel=0.05)
    assert top.clock_free_lateness_ms == pytest.approx(30, rel=0.05)
    assert res.info.clock_free.agrees
    # per waiting rank and step, its waits for rank 2 are at most its time in collectives
    for d in res.ranks[1:]:
        assert d.wait_ms_per_step <= 30 * 1.1


def test_synthetic_shards_no_delay(tmp_path):
    from synth import make_run

    syn = make_run(tmp_path, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (-1.5, -20.0)})
    res = find_stragglers(distprof.load(syn.run_dir))
    assert res.info.named == [] and not any(h.named for h in res.info.hosts)


@pytest.mark.parametrize("seed", range(5))
def test_scheduling_noise_names_nobody_but_a_real_delay(seed):
    # |N(0, 6 ms)| start noise every step (an oversubscribed CPU): someone is always a few ms late by chance; the
    # floor follows that noise, so nobody is named — but a rank 25 ms late is, however noisy
    quiet = find_stragglers(summarize_merged(ddp_run(4, n_steps=5, noise_ms=6.0, seed=seed)))
    assert quiet.info.named == []
    assert quiet.info.rule.threshold_ms > 2.0 and quiet.info.rule.step_noise_ms > 1.0
    loud = find_stragglers(summarize_merged(ddp_run(4, n_steps=5, noise_ms=6.0, seed=seed, late_rank=1, late_ms=25)))
    assert loud.info.named == [1]
    assert loud.ranks[0].rank == 1


def test_two_ranks_no_figure_doubles():
    """At 2 ranks one rank late by X makes the other early by X: every figure of the late one is X (not 2X), the
    early one's lateness is −X."""
    res = find_stragglers(summarize_merged(ddp_run(2, n_steps=5, late_rank=1, late_ms=20, buckets=1)))
    assert res.info.named == [1]
    r = _by_rank(res)
    assert r[1].lateness_ms == pytest.approx(20.0) and r[0].lateness_ms == pytest.approx(-20.0)
    assert r[1].blame_ms_per_step == pytest.approx(20.0) and r[0].wait_ms_per_step == pytest.approx(20.0)
    assert r[1].cost_ms_per_step == pytest.approx(20.0) and r[1].clock_free_lateness_ms == pytest.approx(20.0)
    assert max(res.info.cells.lateness_ms) == pytest.approx(20.0)
    assert res.info.rule.threshold_ms == pytest.approx(1.0)  # a steady delay adds no step-to-step noise


@pytest.mark.parametrize("n_steps", [5, 6])
def test_a_rank_late_by_a_tenth_of_the_step_in_every_step_is_named_however_it_varies(n_steps):
    """The README demo on a busy host: rank 1 late by 8-20 ms of a ~45 ms step, differently every step. Its
    lateness varies as much as it stays, which raises the floor — but never above 8 % of the step: it is named."""
    lat = [19.7, 8.3, 17.9, 15.5, 7.9, 11.5][:n_steps]
    res = find_stragglers(summarize_merged(ddp_run(2, n_steps=n_steps, late_at={(s, 1): x for s, x in enumerate(lat)},
                                                   buckets=1)))
    info = res.info.rule
    assert info.step_noise_ms > 4 and info.threshold_ms == pytest.approx(0.08 * info.median_step_ms)
    assert res.info.named == [1]
    assert res.ranks[0].lateness_ms == pytest.approx(float(np.median(lat)))  # the median over its steps


def test_waiting_inside_an_op_is_not_slowness():
    """FSDP-like: rank 1 computes 20 ms longer before each all-gather; rank 0 reaches it first and waits inside
    FSDP::pre_forward (an annotation) and inside c10d::_reduce_scatter_base_ nested in a backward cpu_op. Rank 0's
    root cause must not call those ops slower; rank 1's names its slower compute."""
    from test_breakdown import ANNOT, COMM, COMPUTE, CPU_OP, RunBuilder

    from distprof.storage import schema

    b = RunBuilder(2)
    for r in range(2):
        b.thread(r, 1, schema.THREAD_MAIN)
        b.thread(r, 2, schema.THREAD_COMM, 0)
    seq = 0
    for s in range(3):
        t = 100.0 * s
        for r in range(2):
            b.step(r, 10 + s, t, t + 90)
        slow = 20.0  # rank 1's extra compute
        for r in range(2):
            c = 10 + (slow if r == 1 else 0)
            b.event(r, "aten::mm", CPU_OP, COMPUTE, 1, t, t + c, step=10 + s)
            # the all-gather: issued at the end of compute, done when the late rank arrives
            b.event(r, "FSDP::pre_forward", ANNOT, 0, 1, t + c, t + 32, step=10 + s)
        for r in range(2):
            i = b.event(r, "gloo:all_gather", ANNOT, COMM, 2, t + (30 if r == 1 else 10), t + 32, step=10 + s)
            b.comm(i, role=schema.ROLE_EXEC, seq=seq, op="all_gather")
        seq += 1
        for r in range(2):
            b.event(r, "aten::addmm", CPU_OP, COMPUTE, 1, t + 32, t + 60, step=10 + s)
            # backward hook: a cpu_op wrapper whose reduce-scatter wait sits in a nested c10d op
            b.event(r, "RegisterPostBackwardFunctionBackward", CPU_OP, COMPUTE, 1, t + 60, t + 85, step=10 + s)
            i = b.event(r, "c10d::_reduce_scatter_base_", CPU_OP, COMM, 1, t + 62, t + 84, step=10 + s)
            b.comm(i, role=schema.ROLE_ENQUEUE)
            # rank 0's worker starts the reduce-scatter 10 ms late (still busy): its main thread waits in c10d all along
            j = b.event(r, "gloo:all_reduce", ANNOT, COMM, 2, t + 62 + (10 if r == 0 else 0), t + 84, step=10 + s)
            b.comm(j, role=schema.ROLE_EXEC, seq=seq, op="all_reduce")
        seq += 1
    run = summarize_merged(b.build())
    (rc0,) = root_cause(run, [0])
    slower0 = {o.name for o in rc0.ops if o.excess_ms_per_step > 0.5}
    assert not slower0 & {"FSDP::pre_forward", "RegisterPostBackwardFunctionBackward"}, rc0.ops
    (rc1,) = root_cause(run, [1])
    assert rc1.ops[0].name == "aten::mm" and rc1.ops[0].excess_ms_per_step == pytest.approx(20.0)


def _cpu_waits(rs, wait_ms_of):
    """Give the summary's steps and collective rows cumulative CPU waits (as cpu/samples would): a rank's wait grows
    by ``wait_ms_of(rank, step)`` between its step's start and its first arrival, and by nothing elsewhere."""
    cr, st = rs.collective_rows, rs.steps
    for tab in (cr, st):
        for c in ("cpu_wait_at_start_ns", "cpu_wait_at_end_ns"):
            tab[c] = np.zeros(len(tab["step"]))
    total: dict[int, float] = {}
    for i in np.lexsort((st["start_ns"], st["rank"])):
        r, s = int(st["rank"][i]), int(st["step"][i])
        base = total.get(r, 0.0)
        st["cpu_wait_at_start_ns"][i] = base
        total[r] = base + wait_ms_of(r, s) * 1e6
        st["cpu_wait_at_end_ns"][i] = total[r]
        rows = (cr["rank"] == r) & (cr["step"] == s)
        cr["cpu_wait_at_start_ns"][rows] = total[r]
        cr["cpu_wait_at_end_ns"][rows] = total[r]


def test_extra_work_takes_the_peers_wait_for_a_cpu_out():
    """The README demo's effect: rank 1 sleeps 20 ms before its backward; meanwhile rank 0 waits 7 ms for a CPU
    (the host's other work) before its own arrival, so rank 1 is only 13 ms late. Its extra work is the 20 ms; the
    lateness stays what the arrivals show and names it."""
    late_at = {**{(s, 1): 20.0 for s in range(5)}, **{(s, 0): 7.0 for s in range(5)}}
    rs = summarize_merged(ddp_run(2, n_steps=5, late_at=late_at, buckets=1))
    _cpu_waits(rs, lambda r, s: 7.0 if r == 0 else 0.0)
    res = find_stragglers(rs)
    d = _by_rank(res)
    assert res.info.named == [1]
    assert d[1].lateness_ms == pytest.approx(13.0)
    assert d[1].extra_work_ms == pytest.approx(20.0) and d[0].extra_work_ms == pytest.approx(-20.0)
    assert res.info.cells.extra_work_ms[5:] == pytest.approx([20.0] * 5)


def test_a_rank_late_only_by_its_wait_for_a_cpu_is_named_and_its_contention_says_so():
    """Rank 1 is 20 ms late every step and its samples say it spent those 20 ms waiting for a CPU: it is late, so it
    is named (the rule takes arrivals as they are); its extra work is 0, and the CPU-contention finding says the
    waits moved its arrivals."""
    from distprof.analysis.findings.cpu import cpu_contention, cpu_contention_text
    from distprof.analysis.types import FindingRules

    rs = summarize_merged(ddp_run(2, n_steps=6, late_rank=1, late_ms=20, jitter_ms=JITTER[:2]))
    _cpu_waits(rs, lambda r, s: 20.0 if r == 1 else 0.0)
    res = find_stragglers(rs)
    d = _by_rank(res)[1]
    assert res.info.named == [1]
    assert d.lateness_ms == pytest.approx(20.1, abs=0.2) and d.extra_work_ms == pytest.approx(0.1, abs=0.2)
    rs.steps["cpu_wait_ms"] = np.where(rs.steps["rank"] == 1, 20.0, 0.0)
    (hit,) = cpu_contention(rs, FindingRules(), res)
    assert hit.rank == 1 and hit.notes["arrival_shift"][0] == 1
    _, evidence, _ = cpu_contention_text({**hit.metrics, "impact_pct": hit.impact_pct}, "rank 1", hit)
    assert "straggler rank 1 arrives 20.1 ms late per step while its own work is 0.1 ms" in evidence


def test_a_wait_for_a_cpu_after_the_arrival_does_not_change_the_extra_work():
    """Rank 1 sleeps 20 ms before its backward, and waits 20 ms for a CPU inside its collectives (after arriving):
    that wait did not make it late, and its extra work is its lateness."""
    rs = summarize_merged(ddp_run(2, n_steps=6, late_rank=1, late_ms=20, jitter_ms=JITTER[:2]))
    cr, st = rs.collective_rows, rs.steps
    for tab in (cr, st):
        for c in ("cpu_wait_at_start_ns", "cpu_wait_at_end_ns"):
            tab[c] = np.zeros(len(tab["step"]))
    for r in (0, 1):  # the wait grows inside each collective (after the arrival), by 20 ms a step on rank 1
        rows = np.flatnonzero(cr["rank"] == r)
        rows = rows[np.argsort(cr["start_ns"][rows], kind="stable")]
        grow = np.full(rows.size, 20e6 if r == 1 else 0.0)
        cr["cpu_wait_at_end_ns"][rows] = np.cumsum(grow)
        cr["cpu_wait_at_start_ns"][rows] = np.r_[0.0, np.cumsum(grow)[:-1]]
        for i in np.flatnonzero(st["rank"] == r):  # the steps' ends agree: the wait so far at each
            mine = rows[cr["step"][rows] == st["step"][i]]
            st["cpu_wait_at_start_ns"][i] = cr["cpu_wait_at_start_ns"][mine].min()
            st["cpu_wait_at_end_ns"][i] = cr["cpu_wait_at_end_ns"][mine].max()
    res = find_stragglers(rs)
    d = _by_rank(res)[1]
    assert res.info.named == [1]
    assert d.extra_work_ms == pytest.approx(d.lateness_ms)


def test_an_unknown_cpu_wait_on_any_rank_leaves_extra_work_unknown():
    rs = summarize_merged(ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER))
    _cpu_waits(rs, lambda r, s: 0.0)
    rs.collective_rows["cpu_wait_at_start_ns"][rs.collective_rows["rank"] == 0] = np.nan  # rank 0 unknown
    res = find_stragglers(rs)
    assert all(d.extra_work_ms is None for d in res.ranks) and res.info.named == [2]


def test_blame_is_a_union_per_waiting_rank_and_host():
    """Two hosts; rank 3 (host b) 30 ms late before backward with 3 overlapping bucket all-reduces per step: each
    waiting rank waits once per step (from its first bucket's arrival to rank 3's last), never 3 x 30 ms; host b's
    blame is the waits of host a's ranks only."""
    run = ddp_run(4, n_steps=4, late_rank=3, late_ms=30, buckets=3, hosts=["a", "a", "b", "b"])
    res = find_stragglers(summarize_merged(run))
    d = _by_rank(res)
    # buckets 5.06 ms apart: a waiting rank waits from 0 to 30 + 2 x 5.06
    assert d[0].wait_ms_per_step == pytest.approx(40.12) and d[2].wait_ms_per_step == pytest.approx(40.12)
    assert d[3].blame_ms_per_step == pytest.approx(3 * 40.12)
    hosts = {h.host: h for h in res.info.hosts}
    assert hosts["b"].blame_ms == pytest.approx(4 * 2 * 40.12)  # ranks 0 and 1, 4 steps
    assert hosts["a"].blame_ms == 0.0


def test_a_one_off_spike_does_not_move_the_lateness():
    """Rank 1 is 10 ms late every step, and 150 ms once (the host held it off the CPU): its lateness is the typical
    step's, 10 ms, not a mean pulled to 34 ms."""
    late = {(s, 1): (150.0 if s == 2 else 10.0) for s in range(6)}
    res = find_stragglers(summarize_merged(ddp_run(2, n_steps=6, late_at=late, buckets=1)))
    assert res.info.named == [1] and res.ranks[0].lateness_ms == pytest.approx(10.0)


def test_the_rule_paragraph_is_the_docs_paragraph():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "report-format.md").read_text()
    quoted = doc.split("**Naming rule** (`straggler_info.rule.text`, the same words):", 1)[1].split("\n\n")[1]
    assert " ".join(x[2:] for x in quoted.splitlines()) == StragglerRule().text()


def test_union_of_intervals():
    from distprof.analysis.cross.stragglers.blame import union_ms

    key = np.array([0, 0, 0, 1, 1])
    lo = np.array([0, 5, 30, 0, 100]) * 1_000_000
    hi = np.array([10, 20, 40, 50, 110]) * 1_000_000
    (k,), ms = union_ms((key,), lo, hi)
    assert k.tolist() == [0, 1] and ms.tolist() == [30.0, 60.0]


def test_chance_is_not_taken_off_a_real_delay():
    """Two ranks, one step of 12 collectives: rank 1 is 3.5 ms late at the first (a delay before forward), rank 0
    0.6 ms late at another by chance. Rank 1's lateness is the delay, 3.5 ms — taking rank 0's chance off it too gave
    2.9 (FSDP2 runs read 0.88 x their delay). A lateness near chance still loses it: that is what cancels noise."""
    from distprof.analysis.cross.stragglers.lateness import Cells, step_lateness

    def lateness(lag_1: list[float]) -> dict[int, float]:
        lat = np.array([[-x, x] for x in lag_1]).ravel()  # rows (collective, rank): at 2 ranks rank 0 = −rank 1
        cells = Cells(np.zeros(lat.size, np.int64), np.tile([0, 1], len(lag_1)), 2)
        sl = step_lateness(cells, lat)
        return {int(g): float(v) for g, v in zip(cells.group, sl.lateness)}

    delayed = lateness([3.5, 0.1, -0.2, 0.0, 0.1, -0.6] + [0.05] * 6)
    assert delayed[1] == pytest.approx(3.5) and delayed[0] == pytest.approx(0.0)  # its 0.6 is within chance
    noisy = lateness([1.0, -0.8, 0.1, 0.0, 0.2, -0.3] + [0.05] * 6)  # both late by chance: 1.0 and 0.8
    assert noisy[1] == pytest.approx(0.2)
    fading = lateness([1.8, -0.6] + [0.0] * 10)  # 3 x chance: half of it taken off
    assert fading[1] == pytest.approx(1.8 - 0.3)


def test_the_inputs_another_process_is_sent_give_the_same_analysis():
    """What MPI process 1 is sent (``straggler_inputs``: a few columns and tables, not the run summary) gives the
    analysis of the whole run summary, with a slow host, CPU waits and a steps selection alike; and it carries no
    op names, sizes or per-rank summaries."""
    import pickle

    from distprof.analysis.cross.stragglers.inputs import straggler_inputs

    late_at = {**{(s, 3): 20.0 for s in range(4)}, **{(s, 0): 4.0 for s in range(4)}}
    rs = summarize_merged(ddp_run(4, n_steps=4, late_at=late_at, jitter_ms=JITTER,
                                  hosts=["nodeA", "nodeA", "nodeB", "nodeB"]))
    _cpu_waits(rs, lambda r, s: 4.0 if r == 0 else 0.0)
    for selection in (None, (11, 12)):
        rs.steps_selection = selection
        inputs = pickle.loads(pickle.dumps(straggler_inputs(rs)))  # as it travels
        whole, sent = find_stragglers(rs), find_stragglers(inputs)
        assert sent == whole and 3 in sent.info.named and sent.info.hosts[0].host == "nodeB"
    assert set(inputs.collectives.members) == {"inst", "rank", "window", "pg", "seq", "row", "start_ns", "end_ns"}
    assert set(inputs.collective_rows) == {"rank", "step", "cpu_wait_at_start_ns", "cpu_wait_at_end_ns"}
    assert not hasattr(inputs, "ranks")


@pytest.mark.parametrize("sort", [True, False])
def test_cells_keys_sorted_or_not_are_np_unique(sort):
    """The cells' distinct keys skip np.unique's sort when the keys come sorted; either way they are np.unique's."""
    from distprof.analysis.cross.stragglers.lateness import Cells, _distinct

    rng = np.random.default_rng(3)
    key = rng.integers(-5, 40, 500)
    key = np.sort(key) if sort else key
    u, inv = _distinct(key)
    wu, winv = np.unique(key, return_inverse=True)
    assert np.array_equal(u, wu) and np.array_equal(inv, winv.reshape(-1))
    g = rng.integers(0, 3, key.size)
    c = Cells(key, g, 3)
    assert np.array_equal(c.step[c.idx], key) and np.array_equal(c.group[c.idx], g)


@pytest.mark.parametrize("seed", range(6))
def test_cells_argmax_is_the_first_largest_row(seed):
    """Per cell the row of the largest value, the first of tied ones; a cell holding a NaN gives its first NaN row
    (NaN sorts last): the row the sort by (cell, value, later rows first) ends each cell with."""
    from distprof.analysis.cross.stragglers.lateness import Cells

    rng = np.random.default_rng(seed)
    n = 600
    key, g = rng.integers(0, 12, n), rng.integers(0, 4, n)
    v = rng.integers(-3, 4, n).astype(np.float64)  # many ties
    v[rng.random(n) < 0.02] = np.nan
    v[rng.random(n) < 0.02] = -np.inf
    c = Cells(key, g, 4)
    o = np.lexsort((-np.arange(n), v, c.idx))  # by cell, then value (NaN last), tied rows later first
    last = np.r_[c.idx[o][1:] != c.idx[o][:-1], True]
    want = np.empty(c.n, np.int64)
    want[c.idx[o][last]] = o[last]
    assert c.argmax(v).tolist() == want.tolist()


def _union_by_brute_force(keys, lo, hi):
    """Per distinct key tuple, the union's length (ms) by merging its intervals one by one."""
    out = {}
    for kt in sorted(set(zip(*[k.tolist() for k in keys]))):
        m = np.ones(lo.size, bool)
        for col, v in zip(keys, kt):
            m &= col == v
        total, end = 0, -np.inf
        for a, b in sorted(zip(lo[m].tolist(), hi[m].tolist())):
            if b <= a:  # an empty interval covers nothing
                continue
            if a >= end:
                total += b - a
            elif b > end:
                total += b - end
            end = max(end, b)
        out[kt] = total / 1e6
    return out


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_union_of_intervals_per_key_tuple_is_the_merged_length(seed, wide):
    """Epoch-nanosecond intervals keyed by (waiter, culprit, step), ties of key and start included: the one-sort path
    and (`wide`: keys spread too far to pack beside the times) the unique-then-sort path give each key's union."""
    from distprof.analysis.cross.stragglers.blame import union_ms

    rng = np.random.default_rng(seed)
    n = 400
    keys = (rng.integers(0, 4, n), rng.integers(0, 3, n), rng.integers(0, 5, n) * ((1 << 40) if wide else 1))
    lo = 1_765_000_000_000_000_000 + rng.integers(0, 50, n) * 1_000_000
    hi = lo + rng.integers(-2, 30, n) * 1_000_000  # some empty (hi <= lo), as waits are not
    got_keys, ms = union_ms(keys, lo, hi)
    got = {kt: m for kt, m in zip(zip(*[k.tolist() for k in got_keys]), ms.tolist())}
    assert got == pytest.approx(_union_by_brute_force(keys, lo, hi))
    assert list(got) == sorted(got)  # the distinct keys in np.unique's order
