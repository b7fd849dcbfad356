"""benchmarks/synth.py --shape: each LLM shape's run loads, holds the collectives per step per rank its parallelism
puts there, and the report names that parallelism (FSDP2, TP, PP with its bubble, EP). Small runs: 16 ranks on 2
hosts, 8 layers, 2 recorded steps."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import bench_module

import distprof
from distprof.analysis.report.build import build_report

LAYERS, MICRO = 8, 8


@pytest.fixture(scope="module")
def synth():
    return bench_module("synth")


def _run(synth, tmp_path, shape: str, *extra: str):
    args = synth.parse_args(["--shape", shape, "--ranks", "16", "--layers", str(LAYERS), "--steps", "2",
                             "--windows", "1", "--events", "3000", "--run-id", shape, "-o", str(tmp_path / shape),
                             *extra])
    spec = synth.spec_from(args)
    synth.generate(spec, tmp_path / shape)
    return spec, distprof.load(tmp_path / shape, progress=False)


def _per_step(run) -> tuple[dict[int, float], dict[int, float]]:
    """rank -> collectives per recorded step, and rank -> point-to-point transfers per recorded step."""
    colls, p2p = {}, {}
    for r, s in run.ranks.items():
        n_steps = len(np.asarray(s.steps["step"]))
        colls[r] = int(np.count_nonzero(np.asarray(s.collectives["step"]) >= 0)) / n_steps
        p2p[r] = int(np.count_nonzero(np.asarray(s.p2p.get("step", np.zeros(0))) >= 0)) / n_steps
    return colls, p2p


# shape -> (collectives per step per rank: lo, hi; transfers per step per rank: lo, hi; styles the report names)
L, M, S = LAYERS, MICRO, 4
EXPECTED = {
    "fsdp": ((3 * L, 3 * L), (0, 0), ["FSDP2"]),  # all-gather forward and backward, reduce-scatter, per layer
    "tp": ((4 * L, 5 * L), (0, 0), ["DDP", "TP"]),  # 4 all-reduces per layer, DDP buckets
    "pp": ((1, L // S), (2 * M, 4 * M), ["DDP", "PP"]),  # DDP buckets; 1F1B sends and receives, 2 or 4 per micro-batch
    "ep": ((4 * L, 5 * L), (0, 0), ["DDP", "EP"]),  # dispatch and combine, forward and backward, per layer
    # TP x PP x FSDP at 16 ranks: tp=2, pp=4, dp=2; per stage L/4 layers, TP all-reduces for every micro-batch
    # and one all-gather and one reduce-scatter per layer (at the first forward and the last backward micro-batch)
    "llm": ((4 * (L // S) * M + 2 * (L // S),) * 2, (2 * M, 4 * M), ["FSDP2", "TP", "PP"]),
}


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_shape_collectives_and_parallelism(synth, tmp_path, shape):
    (c_lo, c_hi), (p_lo, p_hi), styles = EXPECTED[shape]
    _, run = _run(synth, tmp_path, shape)
    assert sorted(run.ranks_present) == list(range(16)) and not run.ranks_missing
    colls, p2p = _per_step(run)
    assert all(c_lo <= c <= c_hi for c in colls.values()), (shape, sorted(set(colls.values())))
    assert all(p_lo <= c <= p_hi for c in p2p.values()), (shape, sorted(set(p2p.values())))
    rep = build_report(run)
    assert rep.parallelism.styles == styles, rep.parallelism.evidence
    # streams: FSDP's gathers run on their NCCL stream while the previous layer computes (mostly hidden); TP's
    # all-reduces and MoE's all-to-alls block the compute stream (all exposed)
    exposed = {(r.group, r.op): r.exposed_ms_per_step / r.ms_per_step for r in rep.collectives}
    hidden = {"fsdp": [("default_pg", "all_gather")], "llm": [("mesh_dp_shard", "all_gather")]}.get(shape, [])
    blocking = {"tp": [("mesh_tp", "all_reduce")], "ep": [("mesh_ep", "all_to_all")],
                "llm": [("mesh_tp", "all_reduce")]}.get(shape, [])
    assert all(exposed[k] < 0.6 for k in hidden) and all(exposed[k] > 0.95 for k in blocking), exposed
    if "PP" in styles:
        assert len(rep.pipelines) == 16 // S  # one per data- and tensor-parallel coordinate
        for pipe in rep.pipelines:
            assert len(pipe.stages) == S and pipe.micro_batches == M
            # 1F1B's fill and drain: (S - 1) / (M + S - 1) of the step, 27 %; the stages wait about that long
            assert 0.5 * pipe.ideal_bubble_pct <= pipe.bubble_pct <= 1.5 * pipe.ideal_bubble_pct
    if "TP" in styles:
        assert any(g.kind == "mesh_tp" and g.role == "tensor" and g.ops == ["all_reduce"]
                   for g in rep.parallelism.groups)


def test_llm_with_experts_names_all_four(synth, tmp_path):
    _, run = _run(synth, tmp_path, "llm", "--ep", "2")
    colls, _ = _per_step(run)
    per_stage = L // S
    # TP all-reduces and MoE all-to-alls for every micro-batch, 4 each per layer; FSDP's gathers and reductions
    lo = 8 * per_stage * M
    assert all(c == lo + 2 * per_stage for c in colls.values()), sorted(set(colls.values()))
    assert build_report(run).parallelism.styles == ["FSDP2", "TP", "PP", "EP"]


@pytest.mark.parametrize("shape,least", [("fsdp", 96), ("tp", 128), ("ep", 128), ("llm", 256)])
def test_realistic_layers_give_hundreds_of_collectives_per_step(synth, shape, least):
    """At --layers 32 (an 8B-class model) on 1,024 ranks, a rank's step program holds hundreds of collectives."""
    args = synth.parse_args(["--shape", shape, "--ranks", "1024", "-o", "unused"])
    spec = synth.spec_from(args)
    shapes = synth.shapes()
    plan = shapes.make_plan(spec)
    counts = [sum(it.kind == "coll" for it in shapes.program(plan, s)) for s in range(plan.pp)]
    assert min(counts) >= least, counts


def test_default_shape_is_unchanged(synth):
    """The default shape's spec is what it was before --shape (other benchmarks and tests use it)."""
    spec = synth.spec_from(synth.parse_args(["--ranks", "16", "-o", "unused"]))
    assert (spec.shape, spec.tp, spec.names, spec.colls, spec.pp, spec.ep, spec.micro) == ("default", 1, 3000, 4, 1,
                                                                                           1, 1)
    assert synth.process_groups(spec) == [{"index": 0, "name": "0", "desc": "default_pg", "backend": "cuda:nccl",
                                           "ranks": list(range(16))}]
