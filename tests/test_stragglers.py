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


def test_late_rank_is_named_with_hand_computed_figures():
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER)))
    assert res.info.named == [2]
    top = res.ranks[0]
    assert top.rank == 2
    # one 20 ms delay before backward delays both bucket all-reduces: mean lateness ≈ the delay, not twice it
    assert top.mean_lateness_ms == pytest.approx(20.1)
    assert top.mean_instance_lateness_ms == pytest.approx(20.1)
    assert top.late_fraction == 1.0
    # blame per instance = (20.2-0) + (20.2-0.1) + (20.2-0.3) = 60.2; 6 instances over 3 steps
    assert top.blame_ms == pytest.approx(6 * 60.2)
    assert top.blame_ms_per_step == pytest.approx(2 * 60.2)
    assert top.lost_ms_per_step == pytest.approx(19.9)  # vs the second-latest arrival (rank 3)
    # clock-free: durations only (all end together): median of the others' durations − own
    assert top.clock_free_lateness_ms == pytest.approx(20.1)
    assert top.clock_free_wait_ms == pytest.approx(0.0)
    r = _by_rank(res)
    assert r[0].clock_free_wait_ms == pytest.approx(20.2)
    assert r[0].blame_ms == 0 and r[0].late_fraction == 0
    assert res.info.clock_free.agrees is True
    assert res.info.clock_free.named_confirmed == {"2": True}
    assert [p.rank for p in res.info.per_step] == [2, 2, 2]
    assert res.info.changes == []
    assert res.info.rule.threshold_ms == pytest.approx(1.0)


def test_no_delay_names_nobody():
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, jitter_ms=JITTER)))
    assert res.info.named == []
    # the ranking still exists: rank 3 arrives last, 0.2 ms after the median of the others
    assert res.ranks[0].rank == 3
    assert res.ranks[0].mean_lateness_ms == pytest.approx(0.2)
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
    # rank 2: excess ~20 ms in 4 of 6 steps, ~0 in 2, while the ranks otherwise agree to 0.3 ms: often far out,
    # named (not steadily late: the bound of its mean excess is below the floor). Rank 1: a third of its steps.
    assert res.info.named == [2]
    assert r[2].excess_bound_ms < 1.0 and r[2].outlier_step_fraction == pytest.approx(4 / 6)
    assert r[1].outlier_step_fraction == pytest.approx(2 / 6) and not r[1].named
    assert res.ranks[0].rank == 2


def test_late_in_one_of_three_steps_is_not_named():
    # 20 ms late once in 3 steps, however far out: not consistent across steps
    late = {(1, 2): 20.0}
    res = find_stragglers(summarize_merged(ddp_run(4, n_steps=3, late_at=late, jitter_ms=JITTER)))
    assert [p.rank for p in res.info.per_step] == [None, 2, None]
    assert res.info.named == []
    assert _by_rank(res)[2].excess_step_fraction == pytest.approx(1 / 3)


def test_slow_host_names_all_its_ranks():
    run = ddp_run(4, n_steps=3, late_at={(s, r): 20.0 for s in range(3) for r in (2, 3)}, jitter_ms=JITTER,
                  hosts=["nodeA", "nodeA", "nodeB", "nodeB"])
    res = find_stragglers(summarize_merged(run))
    assert sorted(res.info.named) == [2, 3]  # rank 2 is never last, but always 20.2 ms late
    hosts = {h.host: h for h in res.info.hosts}
    assert hosts["nodeB"].named and not hosts["nodeA"].named
    assert hosts["nodeB"].mean_lateness_ms == pytest.approx(20.3 - 0.1)  # its last rank vs node A's last
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
    assert top.mean_lateness_ms == pytest.approx(30, rel=0.05)
    # per instance the 2nd bucket shows little lateness: the per-step figure is the one that matches the delay
    assert top.mean_instance_lateness_ms < 0.7 * 30
    assert top.clock_free_lateness_ms == pytest.approx(30, rel=0.05)
    assert res.info.clock_free.agrees


def test_synthetic_shards_no_delay(tmp_path):
    from synth import make_run

    syn = make_run(tmp_path, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (-1.5, -20.0)})
    res = find_stragglers(distprof.load(syn.run_dir))
    assert res.info.named == [] and not any(h.named for h in res.info.hosts)


def test_arrival_jitter_hand_computed():
    from distprof.analysis.cross.stragglers import arrival_jitter_ms

    run = summarize_merged(ddp_run(4, n_steps=2, jitter_ms=JITTER))
    # arrivals 0, 0.1, 0.2, 0.3: median 0.15, absolute deviations .15 .05 .05 .15 -> MAD 0.1 -> σ = 1.4826 × 0.1
    assert arrival_jitter_ms(run, collective_instances(run)) == pytest.approx(0.14826)


@pytest.mark.parametrize("seed", range(5))
def test_scheduling_noise_names_nobody_but_a_real_delay(seed):
    # |N(0, 6 ms)| start noise every step (an oversubscribed CPU): someone is always a few ms late by chance
    quiet = find_stragglers(summarize_merged(ddp_run(4, n_steps=5, noise_ms=6.0, seed=seed)))
    assert quiet.info.named == []
    assert quiet.info.rule.threshold_ms == pytest.approx(1.0)  # the floor no longer follows the jitter
    loud = find_stragglers(summarize_merged(ddp_run(4, n_steps=5, noise_ms=6.0, seed=seed, late_rank=1, late_ms=25)))
    assert loud.info.named == [1]
    assert loud.ranks[0].rank == 1


def test_two_rank_job_names_its_straggler():
    # with 2 ranks the cross-rank scatter is the straggler's own lateness: it must not raise the threshold
    res = find_stragglers(summarize_merged(ddp_run(2, n_steps=5, late_rank=1, late_ms=20)))
    assert res.info.named == [1]
    assert res.info.rule.arrival_jitter_ms == 0.0


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


@pytest.mark.parametrize("waited_ms, reason", [(20.0, True), (0.0, False), (3.0, False)])
def test_a_rank_held_back_by_its_cpu_is_named_and_its_wait_stated(waited_ms, reason):
    """Rank 2 arrives 20 ms late every step. It is late whatever held it back, so it is named either way; when its
    scheduler statistics say it waited that long for a CPU more than its peers (``steps.cpu_wait_opt_ns``), its
    finding says so; a small extra wait is not mentioned."""
    from distprof.analysis.types import FindingRules
    from distprof.analysis.findings.stragglers import straggler_findings

    run = ddp_run(4, n_steps=6, late_rank=2, late_ms=20, jitter_ms=JITTER)
    run.steps["cpu_wait_opt_ns"] = np.where(run.steps["rank"] == 2, int(waited_ms * 1e6), 0)
    res = find_stragglers(summarize_merged(run))
    d = _by_rank(res)[2]
    assert d.named and res.info.named == [2]
    assert d.cpu_wait_excess_ms == pytest.approx(waited_ms)
    (f,) = straggler_findings(res, [], {r: "h" for r in range(4)}, 30.0, FindingRules())
    assert ("longer for a CPU" in f.evidence) is reason, f.evidence
    assert f.metrics["cpu_wait_excess_ms"] == pytest.approx(waited_ms)


def test_a_late_rank_whose_peers_waited_longer_for_a_cpu_is_still_named():
    """The step-wide wait is not the delay of an arrival: on FSDP2 the waiting rank can show more run-queue wait than
    the slow one (it computes while the slow one is blocked, or the other way round). A negative excess is reported,
    never added to the lateness or used to unname the late rank."""
    run = ddp_run(2, n_steps=6, late_rank=1, late_ms=20, jitter_ms=JITTER)
    run.steps["cpu_wait_opt_ns"] = np.where(run.steps["rank"] == 0, 25_000_000, 0)
    res = find_stragglers(summarize_merged(run))
    assert res.info.named == [1]
    assert _by_rank(res)[1].cpu_wait_excess_ms == pytest.approx(-25.0)


def _cpu_waits(run, rs, wait_ms_of):
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


def test_a_rank_late_only_by_its_wait_for_a_cpu_is_not_named_and_its_contention_says_why():
    """Rank 1 is 20 ms late every step, and its samples say it spent those 20 ms waiting for a CPU before its first
    collective: its own work is its peer's and its lateness is its host's scheduler — it is not named, its row keeps
    the lateness the trace shows, and the CPU-contention finding says it was held back."""
    from distprof.analysis.findings.cpu import cpu_contention, cpu_contention_text
    from distprof.analysis.types import FindingRules

    run = ddp_run(2, n_steps=6, late_rank=1, late_ms=20, jitter_ms=JITTER[:2])
    rs = summarize_merged(run)
    plain = find_stragglers(rs)
    assert plain.info.named == [1] and _by_rank(plain)[1].own_steps_consistent
    _cpu_waits(run, rs, lambda r, s: 20.0 if r == 1 else 0.0)
    res = find_stragglers(rs)
    d = _by_rank(res)[1]
    assert res.info.named == []
    assert d.own_excess_ms == pytest.approx(0.0, abs=0.5) and not d.own_steps_consistent
    assert d.mean_lateness_ms == pytest.approx(20.0, abs=1.0)
    assert d.cpu_wait_excess_ms == pytest.approx(20.0, abs=1.0)
    assert d.lateness_not_cpu_wait_ms == pytest.approx(0.0, abs=1.0)
    rs.steps["cpu_wait_ms"] = np.where(rs.steps["rank"] == 1, 20.0, 0.0)
    (hit,) = cpu_contention(rs, FindingRules(), res)
    assert hit.rank == 1 and hit.metrics["held_back_ms_per_step"] == pytest.approx(20.0, abs=1.0)
    _, evidence, _ = cpu_contention_text({**hit.metrics, "impact_pct": hit.impact_pct}, "rank 1", hit)
    assert "Rank 1 arrived 20" in evidence and "not named a straggler" in evidence


def test_a_late_rank_that_waited_for_a_cpu_after_its_arrivals_is_still_named():
    """Rank 1 sleeps 20 ms before its backward (its own work), and waits 20 ms for a CPU after its collectives (it
    computes while its peer is blocked): the wait after the arrival is not what made it late, and it is named."""
    run = ddp_run(2, n_steps=6, late_rank=1, late_ms=20, jitter_ms=JITTER[:2])
    rs = summarize_merged(run)
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
    assert d.cpu_wait_excess_ms == pytest.approx(0.0, abs=0.5)
    assert d.lateness_not_cpu_wait_ms == pytest.approx(d.mean_lateness_ms)


def test_consistent_own_work_is_named_through_noisy_arrivals():
    """Rank 1 does 6 ms more work before backward every step; rank 0's previous step ran 8 ms long every other step
    (its step starts late: the optimizer, the host), so rank 1's arrival lateness swings +6 / −2 ms and the lateness
    test alone does not name it. Its own work before the first collective, measured from its own step start, is 6 ms
    over its peer's in every step: it is named, and its finding says so."""
    from distprof.analysis.types import FindingRules
    from distprof.analysis.findings.stragglers import straggler_findings

    n = 10
    shift = {s: (8.0 if s % 2 else 0.0) for s in range(n)}
    late_at = {**{(s, 1): 6.0 for s in range(n)}, **{(s, 0): shift[s] for s in range(n)}}
    rs = summarize_merged(ddp_run(2, n_steps=n, late_at=late_at, jitter_ms=JITTER[:2]))
    st = rs.steps
    for i in np.flatnonzero(st["rank"] == 0):  # rank 0's extra time was before its step began, not in its work
        st["start_ns"][i] += int(shift[int(st["step"][i]) - 10] * 1e6)
    res = find_stragglers(rs)
    d = _by_rank(res)[1]
    assert d.mean_lateness_ms == pytest.approx(2.0, abs=0.5)
    assert d.excess_bound_ms < res.info.rule.threshold_ms  # the lateness test alone would not name it
    assert d.own_excess_ms == pytest.approx(6.0, abs=0.5) and d.own_steps_consistent
    assert res.info.named == [1]
    (f,) = straggler_findings(res, [], {0: "h", 1: "h"}, 30.0, FindingRules())
    assert "own work before each step's first collective" in f.evidence
    balanced = find_stragglers(summarize_merged(ddp_run(2, n_steps=n, jitter_ms=JITTER[:2])))
    assert balanced.info.named == [] and not any(x.own_steps_consistent for x in balanced.ranks)


def test_an_unknown_cpu_wait_on_any_rank_leaves_the_step_uncorrected():
    run = ddp_run(4, n_steps=3, late_rank=2, late_ms=20, jitter_ms=JITTER)
    w = np.where(run.steps["rank"] == 2, 20_000_000, 0)
    w[(run.steps["rank"] == 0)] = -1  # rank 0's samples unknown (say, an older shard)
    run.steps["cpu_wait_opt_ns"] = w
    d = _by_rank(find_stragglers(summarize_merged(run)))[2]
    assert d.named and d.cpu_wait_excess_ms == 0.0  # no value for a step where any rank's is unknown


def test_a_named_rank_on_a_slower_cpu_is_said_so():
    """The same work on every rank, but rank 2's training thread needed 1.5x the CPU time per step: its finding says
    its CPU ran slower; without the samples it says nothing about CPUs."""
    from distprof.analysis.findings.stragglers import straggler_findings
    from distprof.analysis.types import FindingRules

    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20, jitter_ms=JITTER, late_kind="compute")
    run.steps["cpu_run_ns"] = np.where(run.steps["rank"] == 2, 45_000_000, 30_000_000)
    res = find_stragglers(summarize_merged(run))
    r = _by_rank(res)
    assert r[2].cpu_time_ratio == pytest.approx(1.5) and r[0].cpu_time_ratio == pytest.approx(1.0)
    f = straggler_findings(res, [], {r: "h" for r in range(4)}, 30.0, FindingRules())
    assert "1.50x the CPU time" in f[0].evidence
    bare = find_stragglers(summarize_merged(ddp_run(4, n_steps=4, late_rank=2, late_ms=20, jitter_ms=JITTER)))
    assert _by_rank(bare)[2].cpu_time_ratio is None
    assert "CPU time" not in straggler_findings(bare, [], {r: "h" for r in range(4)}, 30.0, FindingRules())[0].evidence


def test_a_named_rank_that_faults_every_step_is_said_so():
    """Rank 2 took 8,000 page faults per step against its peers' 50: its finding says so; ranks without the count
    (older shards, imports) have None and nothing is said."""
    from distprof.analysis.findings.stragglers import straggler_findings
    from distprof.analysis.types import FindingRules

    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20, jitter_ms=JITTER, late_kind="compute")
    run.steps["page_faults"] = np.where(run.steps["rank"] == 2, 8000, 50)
    res = find_stragglers(summarize_merged(run))
    d = _by_rank(res)[2]
    assert d.page_faults_per_step == 8000 and d.others_page_faults_per_step == 50
    (f,) = straggler_findings(res, [], {r: "h" for r in range(4)}, 30.0, FindingRules())
    assert "8,000 page faults per step" in f.evidence
    bare = find_stragglers(summarize_merged(ddp_run(4, n_steps=4, late_rank=2, late_ms=20, jitter_ms=JITTER)))
    assert _by_rank(bare)[2].page_faults_per_step is None
    assert "page faults" not in straggler_findings(bare, [], {r: "h" for r in range(4)}, 30.0,
                                                   FindingRules())[0].evidence


@pytest.mark.parametrize("k, n, p", [(5, 5, 1 / 32), (0, 3, 1.0), (2, 3, 0.5), (8, 8, 1 / 256), (3, 0, 1.0)])
def test_the_sign_test_tail(k, n, p):
    from distprof.analysis.cross.stragglers.sign_test import _binomial_half_tail

    assert _binomial_half_tail(k, n) == pytest.approx(p)
    assert _binomial_half_tail(3000, 5000) < 1e-40 and _binomial_half_tail(2500, 5000) == pytest.approx(0.5, abs=0.01)
