"""LLM-shaped synthetic runs for ``benchmarks/synth.py --shape``: per-layer collectives, as large jobs have them.

    python benchmarks/synth.py --shape fsdp --ranks 64 --layers 32 -o /tmp/fsdp64
    python benchmarks/synth.py --shape llm --ranks 1024 --layers 80 --ep 4 -o /tmp/llm1024

A rank runs ``--layers`` transformer layers (``--layers / pp`` on each pipeline stage), forward then backward, each
layer an attention block and an MLP block of compute ops (a ``cpu_op`` launching its kernel on compute stream 7,
names from a vocabulary of ``--names`` real-looking ones), and the collectives its parallelism puts there:

* ``fsdp`` — FSDP2 (``FSDP::pre_forward`` / ``FSDP::pre_backward`` / ``FSDP::post_backward_reduce`` regions): per
  layer an all-gather of its parameters in the forward (the next layer's prefetched while this one computes), again
  in the backward, and a reduce-scatter of its gradients, on the data-parallel NCCL stream, overlapped: 3 x layers
  collectives per step.
* ``tp`` — Megatron-style tensor parallelism in groups of ``--tp`` consecutive ranks (one host): two blocking
  all-reduces per layer forward and two backward (4 x layers), and DDP gradient buckets across the data-parallel
  groups during the backward.
* ``pp`` — a 1F1B pipeline of ``--pp`` stages and ``--micro-batches`` micro-batches: activations sent forward and
  gradients backward (``c10d::send`` / ``c10d::recv_``, ``ncclDevKernel_SendRecv`` on a p2p stream, with the calls
  the capture records, so transfers pair exactly); the stages wait for each other (fill and drain bubbles); DDP
  across.
* ``ep`` — MoE layers: a blocking all-to-all dispatch and combine per layer forward and again backward (4 x layers)
  in groups of ``--ep`` ranks, DDP across.
* ``llm`` — the 3-D mix: TP inside a host, PP stages, FSDP across the data-parallel groups (gathered at each stage's
  first micro-batch, reduced at its last), and with ``--ep`` > 1 MoE all-to-alls.

Ranks are laid out as DeviceMesh does it: rank = (stage x dp + dp index) x tp + tp index. Each group kind has its
own NCCL stream (its collectives queue one after another there); a collective ends at its group's last arrival plus
a transfer time from its size (150 GB/s inside a host, 50 GB/s across, ring factors). The job's timeline is
simulated once for every rank (``plan``), then each rank's events are drawn from it (``columns``).

As in real traces: the backward's ops and the collectives its hooks issue run on the autograd engine's thread;
kernels keep the compute stream 90-95 % busy; ``record_param_comms`` carries torch's per-group sequence number;
about 160 op names, varying a little with the layer (four layer types). ``--slow-rank R --slow-ms X`` makes rank R's
compute X ms longer per step spread over all of it (a slow GPU): with per-layer collectives each one sees only a
small part of it, and in a pipeline the whole pipeline replica slows down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distprof.events.classify import CommArgs
from distprof.events.p2p import P2PCalls
from distprof.storage import schema

MS = 1_000_000
US = 1_000
K = schema.KIND_CODE
MAIN_TID, BWD_TID = 1000, 1001
COMPUTE_STREAM = 7
STREAM_OF = {"dp": 20, "tp": 22, "ep": 24, "pp": 26}  # one NCCL stream per group kind
MB = 1 << 20
BW_INTRA, BW_INTER, LATENCY_NS = 150e9, 50e9, 20 * US


def mesh_defaults(shape: str, ranks: int, tp: int | None, pp: int | None, ep: int | None,
                  micro: int | None) -> tuple[int, int, int, int]:
    """(tp, pp, ep, micro-batches) of a shape for `ranks`, each the caller's where given."""
    d_tp = {"tp": min(8, ranks), "llm": 8 if ranks % 64 == 0 else 2}.get(shape, 1)
    tp = tp or d_tp
    d_pp = {"pp": min(4, ranks), "llm": 4 if ranks % (tp * 8) == 0 else 2}.get(shape, 1)
    pp = pp or d_pp
    ep = ep or (min(8, ranks // (tp * pp)) if shape == "ep" else 1)
    micro = micro or (8 if pp > 1 else 1)
    if ranks % (tp * pp) or (ranks // (tp * pp)) % ep:
        raise SystemExit(f"synth: --shape {shape}: {ranks} ranks do not split into tp={tp} x pp={pp} x dp "
                         f"(with ep={ep} dividing dp)")
    return tp, pp, ep, micro


# ---------------------------------------------------------------------------------------------- the step program

@dataclass(frozen=True)
class Item:
    """One thing a stage does in a step, in program order."""

    kind: str  # compute | coll | send | recv | wait
    phase: int  # 0 forward, 1 backward, 2 optimizer
    label: str = ""  # compute: attn / mlp / opt; coll: the FSDP region around the enqueue, or ''
    work_ms: float = 0.0
    op: str = ""  # all_gather, reduce_scatter, all_reduce, all_to_all, send, recv
    group: str = ""  # dp, tp, ep, pp
    nbytes: int = 0
    blocking: bool = False  # the compute stream waits for it
    ref: int = -1  # wait: the item waited for
    peer: int = 0  # send/recv: +1 the next stage, -1 the previous one
    tag: tuple = ()  # send/recv: ("act" | "grad", micro-batch)
    layer: int = 0  # compute: the layer (its op names vary a little with it, as layer types do)


@dataclass(frozen=True)
class Plan:
    shape: str
    ranks: int
    tp: int
    pp: int
    dp: int
    ep: int
    micro: int
    layers: int  # per stage
    fsdp: bool
    ddp: bool
    per_host: int

    @property
    def moe(self) -> bool:
        return self.ep > 1

    @property
    def stage_size(self) -> int:
        return self.dp * self.tp

    # sizes (bytes) and work (ms per rank), per micro-batch where it applies
    @property
    def share(self) -> float:
        """A micro-batch's part of the work: pipelines run larger models and batches (4 micro-batches' worth)."""
        return min(1.0, 4.0 / self.micro)

    @property
    def tp_bytes(self) -> int:
        return int(16 * MB * self.share)

    @property
    def param_bytes(self) -> int:
        return 96 * MB // self.tp

    @property
    def attn_ms(self) -> float:
        return 1.0 * self.share

    @property
    def mlp_ms(self) -> float:
        return 1.5 * self.share

    @property
    def bucket_layers(self) -> int:
        return max(self.layers // 8, 1)


def schedule_1f1b(stages: int, micro: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B order of forward (F) and backward (B) micro-batches on one stage."""
    warm = min(stages - stage - 1, micro)
    out = [("F", m) for m in range(warm)]
    for i in range(micro - warm):
        out += [("F", warm + i), ("B", i)]
    return out + [("B", m) for m in range(micro - warm, micro)]


@dataclass
class _Program:
    p: Plan
    stage: int
    items: list[Item] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)  # group -> its last collective nobody waited for

    def add(self, **kw) -> int:
        self.items.append(Item(**kw))
        return len(self.items) - 1

    def coll(self, op: str, group: str, nbytes: int, phase: int, blocking: bool, label: str = "") -> int:
        i = self.add(kind="coll", phase=phase, label=label, op=op, group=group, nbytes=nbytes, blocking=blocking)
        if not blocking:
            self.pending[group] = i
        return i

    def block(self, phase: int, kind: str, layer: int) -> None:
        """One layer block's compute and the collectives around it (TP all-reduce after, MoE all-to-all around)."""
        p = self.p
        work = (p.attn_ms if kind == "attn" else p.mlp_ms) * (2.0 if phase else 1.0)
        moe = p.moe and kind == "mlp"
        if moe:
            self.coll("all_to_all", "ep", 2 * p.tp_bytes, phase, True)  # dispatch
        self.add(kind="compute", phase=phase, label=kind, work_ms=work, layer=layer)
        if moe:
            self.coll("all_to_all", "ep", 2 * p.tp_bytes, phase, True)  # combine
        if p.tp > 1:
            self.coll("all_reduce", "tp", p.tp_bytes, phase, True)

    def gathered_layers(self, phase: int, gather: bool, order: list[int]):
        """Yield each layer of `order`; with `gather`, its FSDP all-gather is issued one layer ahead and waited for."""
        region = "FSDP::pre_forward" if phase == 0 else "FSDP::pre_backward"
        ag = {}
        for k, layer in enumerate(order):
            if gather:
                for nxt in order[k:k + 2]:
                    if nxt not in ag:
                        ag[nxt] = self.coll("all_gather", "dp", self.p.param_bytes, phase, False, region)
                self.add(kind="wait", phase=phase, ref=ag[layer])
            yield k, layer

    def forward(self, mb: int) -> None:
        p = self.p
        if self.stage > 0:
            self.add(kind="recv", phase=0, op="recv", group="pp", nbytes=p.tp_bytes, peer=-1, tag=("act", mb))
        for _, layer in self.gathered_layers(0, p.fsdp and mb == 0, list(range(p.layers))):
            self.block(0, "attn", layer)
            self.block(0, "mlp", layer)
        if self.stage < p.pp - 1:
            self.add(kind="send", phase=0, op="send", group="pp", nbytes=p.tp_bytes, peer=1, tag=("act", mb))

    def backward(self, mb: int) -> None:
        p = self.p
        last = mb == p.micro - 1
        if self.stage < p.pp - 1:
            self.add(kind="recv", phase=1, op="recv", group="pp", nbytes=p.tp_bytes, peer=1, tag=("grad", mb))
        gather = p.fsdp and p.micro == 1 and mb == 0  # no pipeline: resharded after forward, gathered again
        order = list(reversed(range(p.layers)))
        for k, layer in self.gathered_layers(1, gather, order):
            self.block(1, "mlp", layer)
            self.block(1, "attn", layer)
            if p.fsdp and last:
                self.coll("reduce_scatter", "dp", p.param_bytes, 1, False, "FSDP::post_backward_reduce")
            if p.ddp and last and p.dp > 1 and ((k + 1) % p.bucket_layers == 0 or k == len(order) - 1):
                self.coll("all_reduce", "dp", p.param_bytes * p.bucket_layers, 1, False)
        if self.stage > 0:
            self.add(kind="send", phase=1, op="send", group="pp", nbytes=p.tp_bytes, peer=-1, tag=("grad", mb))

    def finish(self) -> list[Item]:
        for i in self.pending.values():
            self.add(kind="wait", phase=2, ref=i)
        self.add(kind="compute", phase=2, label="opt", work_ms=3.0)
        return self.items


def program(p: Plan, stage: int) -> list[Item]:
    prog = _Program(p, stage)
    for kind, mb in schedule_1f1b(p.pp, p.micro, stage):
        (prog.forward if kind == "F" else prog.backward)(mb)
    return prog.finish()


# ------------------------------------------------------------------------------------------------- groups, hosts

def make_plan(spec) -> Plan:
    tp, pp, ep = spec.tp, spec.pp, spec.ep
    dp = spec.ranks // (tp * pp)
    if spec.layers % pp:
        raise SystemExit(f"synth: --layers {spec.layers} does not split into {pp} pipeline stages")
    fsdp = spec.shape in ("fsdp", "llm")
    return Plan(shape=spec.shape, ranks=spec.ranks, tp=tp, pp=pp, dp=dp, ep=ep, micro=spec.micro,
                layers=spec.layers // pp, fsdp=fsdp, ddp=not fsdp, per_host=max(spec.ranks // max(spec.hosts, 1), 1))


def group_ids(p: Plan, kind: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every rank's group of `kind` (dp, tp, ep, pp) as an index, and each group's ranks; groups are numbered by
    their lowest rank."""
    r = np.arange(p.ranks)
    s, j = np.divmod(r, p.stage_size)
    d, t = np.divmod(j, p.tp)
    key = {"tp": s * p.dp + d, "dp": s * p.tp + t, "ep": (s * p.tp + t) * (p.dp // p.ep) + d // p.ep, "pp": j}[kind]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    rank_of = np.empty(first.size, np.int64)
    rank_of[np.argsort(first, kind="stable")] = np.arange(first.size)  # key -> number by lowest rank
    gid = rank_of[inv.reshape(-1)]
    o = np.argsort(gid, kind="stable")
    return gid, np.split(r[o], np.flatnonzero(np.diff(gid[o])) + 1)


def _kinds(p: Plan) -> list[str]:
    out = ["tp"] if p.tp > 1 else []
    out += ["dp"] if p.dp > 1 else []
    out += ["pp"] if p.pp > 1 else []
    return out + (["ep"] if p.moe else [])


def _desc(p: Plan, kind: str) -> str:
    return {"tp": "mesh_tp", "pp": "mesh_pp", "ep": "mesh_ep",
            "dp": "mesh_dp_shard" if p.fsdp else "mesh_dp"}[kind]


def process_groups(p: Plan) -> tuple[list[dict], dict[tuple[str, int], str]]:
    """Every group of the job (the default group first; a data-parallel group of every rank is the default group,
    as FSDP's and DDP's default mesh makes it), and (kind, rank) -> the name of the rank's group of that kind."""
    out = [{"index": 0, "name": "0", "desc": "default_pg", "backend": "cuda:nccl", "ranks": list(range(p.ranks))}]
    name_of: dict[tuple[str, int], str] = {}
    for kind in _kinds(p):
        gid, members = group_ids(p, kind)
        if len(members) == 1:
            names = ["0"]
        else:
            names = [f"{kind}{g}" for g in range(len(members))]
            out += [{"index": len(out) + g, "name": names[g], "desc": _desc(p, kind), "backend": "cuda:nccl",
                     "ranks": m.tolist()} for g, m in enumerate(members)]
        name_of.update(((kind, r), names[g]) for r, g in enumerate(gid.tolist()))
    return out, name_of


def _xfer_ns(p: Plan, op: str, nbytes: int, members) -> int:
    hosts = np.asarray(members) // p.per_host
    n = hosts.size
    intra = hosts.min() == hosts.max()
    factor = {"all_reduce": 2 * (n - 1) / n, "send": 1.0, "recv": 1.0}.get(op, (n - 1) / n)
    return int(LATENCY_NS + nbytes * factor / (BW_INTRA if intra else BW_INTER) * 1e9)


def _group_index(p: Plan, stage: int, kind: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """For the ranks of `stage` (in order): their group's number within the stage, and each group's ranks."""
    gid, members = group_ids(p, kind)
    mine, local = np.unique(gid[stage * p.stage_size:(stage + 1) * p.stage_size], return_inverse=True)
    return local.reshape(-1).astype(np.int64), [members[g] for g in mine.tolist()]


# ------------------------------------------------------------------------------------------------- the timeline

@dataclass
class StageTimes:
    """One stage's simulated times: per (rank of the stage, step) its start and end (ns), per item its begin (the
    CPU's issue, or the compute's start), kernel start and end, as offsets from the step's start (int32 ns)."""

    items: list[Item]
    start: np.ndarray
    end: np.ndarray
    begin: np.ndarray
    kstart: np.ndarray
    kend: np.ndarray


@dataclass
class _Stage:
    """A stage's state while one step is simulated (vectors over the stage's ranks)."""

    t: np.ndarray
    free: dict[str, np.ndarray]
    b: np.ndarray
    k: np.ndarray
    e: np.ndarray
    ptr: int = 0


class _Sim:
    def __init__(self, p: Plan, spec, progs: list[list[Item]], t0_ns: int):
        self.p, self.spec, self.progs = p, spec, progs
        self.groups = {(s, kind): _group_index(p, s, kind) for s in range(p.pp) for kind in _kinds(p)}
        self.xfer: dict[tuple, np.ndarray] = {}  # (stage, group kind, op, bytes, peer) -> transfer ns per group
        n_steps = spec.steps * spec.windows
        n = p.stage_size
        self.out = [StageTimes(items=pr, start=np.zeros((n, n_steps), np.int64), end=np.zeros((n, n_steps), np.int64),
                               begin=np.zeros((n, n_steps, len(pr)), np.int32),
                               kstart=np.zeros((n, n_steps, len(pr)), np.int32),
                               kend=np.zeros((n, n_steps, len(pr)), np.int32)) for pr in progs]
        self.t = [np.full(n, t0_ns + 5 * MS, np.int64) for _ in progs]
        self.rng = np.random.default_rng(spec.seed)
        self.slow = np.zeros((p.pp, n))
        if 0 <= spec.slow_rank < p.ranks:
            s, j = divmod(spec.slow_rank, n)
            self.slow[s, j] = spec.slow_ms * MS / sum(1 for it in progs[s] if it.kind == "compute")

    def transfer(self, s: int, i: int, it: Item) -> np.ndarray:
        kind = "pp" if it.kind in ("send", "recv") else it.group
        key = (s, kind, it.op, it.nbytes, it.peer)
        if key not in self.xfer:
            if kind == "pp":
                r0 = s * self.p.stage_size
                self.xfer[key] = np.array([_xfer_ns(self.p, it.op, it.nbytes, [r0, r0 + it.peer * self.p.stage_size])])
            else:
                self.xfer[key] = np.array([_xfer_ns(self.p, it.op, it.nbytes, m)
                                           for m in self.groups[(s, kind)][1]], np.int64)
        return self.xfer[key]

    def step(self, step: int) -> None:
        n = self.p.stage_size
        st = [_Stage(t=t + 50 * US, free={}, b=np.zeros((n, len(pr)), np.int64), k=np.zeros((n, len(pr)), np.int64),
                     e=np.zeros((n, len(pr)), np.int64)) for t, pr in zip(self.t, self.progs)]
        sent: dict[tuple[int, tuple], tuple[int, int, np.ndarray]] = {}
        while any(x.ptr < len(pr) for x, pr in zip(st, self.progs)):
            moved = False
            for s, (x, pr) in enumerate(zip(st, self.progs)):
                while x.ptr < len(pr):
                    it = pr[x.ptr]
                    if it.kind == "recv" and (s, it.tag) not in sent:
                        break
                    self.run(s, x, x.ptr, it, sent, st)
                    x.ptr += 1
                    moved = True
            if not moved:
                raise RuntimeError("synth_shapes: the pipeline schedule is stuck")
        for s, x in enumerate(st):
            o = self.out[s]
            o.start[:, step] = self.t[s]
            o.end[:, step] = x.t + 300 * US
            for arr, src in ((o.begin, x.b), (o.kstart, x.k), (o.kend, x.e)):
                rel = src - self.t[s][:, None]
                if rel.size and (rel.max() >= 2**31 or rel.min() < 0):
                    raise SystemExit("synth: a step longer than 2.1 s; use fewer --layers or --micro-batches")
                arr[:, step] = rel.astype(np.int32)
            self.t[s] = o.end[:, step] + 1 * MS + self.rng.integers(0, 50 * US, n)

    def run(self, s: int, x: _Stage, i: int, it: Item, sent: dict, st: list[_Stage]) -> None:
        x.b[:, i] = x.t
        if it.kind == "compute":
            noise = self.rng.normal(1.0, 0.01, x.t.size)
            x.e[:, i] = x.k[:, i] = x.t
            x.e[:, i] += np.rint(it.work_ms * MS * noise + self.slow[s]).astype(np.int64)
            x.t = x.e[:, i].copy()
        elif it.kind == "wait":
            x.t = np.maximum(x.t, x.e[:, it.ref])
            x.k[:, i] = x.e[:, i] = x.t
        elif it.kind == "coll":
            gid, members = self.groups[(s, it.group)]
            x.t = x.t + 40 * US
            k = np.maximum(x.b[:, i] + 10 * US, x.free.get(it.group, 0))
            last = np.zeros(len(members), np.int64)
            np.maximum.at(last, gid, k)
            x.k[:, i], x.e[:, i] = k, (last + self.transfer(s, i, it))[gid]
            x.free[it.group] = x.e[:, i]
            if it.blocking:
                x.t = np.maximum(x.t, x.e[:, i])
        else:  # send / recv: a send does not hold its stage; a receive waits for the send and the transfer
            x.t = x.t + 20 * US
            x.k[:, i] = x.b[:, i] + 10 * US
            if it.kind == "send":
                sent[(s + it.peer, it.tag)] = (s, i, x.k[:, i])
            else:
                ss, si, ks = sent.pop((s, it.tag))
                x.e[:, i] = np.maximum(x.k[:, i], ks) + self.transfer(s, i, it)
                st[ss].e[:, si] = x.e[:, i]
                x.t = np.maximum(x.t, x.e[:, i])


def simulate(p: Plan, spec, t0_ns: int) -> list[StageTimes]:
    progs = [program(p, s) for s in range(p.pp)]
    sim = _Sim(p, spec, progs, t0_ns)
    for step in range(spec.steps * spec.windows):
        if step and step % spec.steps == 0:  # the wait and warm-up steps between windows are not recorded: a gap
            sim.t = [t + 3 * (o.end[:, step - 1] - o.start[:, step - 1]) + 3 * MS for t, o in zip(sim.t, sim.out)]
        sim.step(step)
    return sim.out


# ------------------------------------------------------------------------------------------------- a rank's events

FWD_NAMES = ("aten::linear", "aten::addmm", "aten::matmul", "aten::mm", "aten::layer_norm", "aten::native_layer_norm",
             "aten::add", "aten::mul", "aten::silu", "aten::gelu", "aten::_scaled_dot_product_flash_attention",
             "aten::view", "aten::reshape", "aten::transpose", "aten::contiguous", "aten::clone", "aten::copy_",
             "aten::to", "aten::_to_copy", "aten::split", "aten::cat", "aten::dropout", "aten::softmax",
             "aten::rsqrt", "aten::pow", "aten::mean", "aten::neg", "aten::slice", "aten::bmm", "aten::empty",
             "aten::t", "aten::expand", "aten::topk", "aten::index_select", "aten::scatter_add_", "aten::sum")
BWD_NAMES = tuple(f"autograd::engine::evaluate_function: {n}" for n in (
    "MmBackward0", "AddmmBackward0", "NativeLayerNormBackward0", "SiluBackward0", "GeluBackward0",
    "ScaledDotProductFlashAttentionBackward0", "MulBackward0", "AddBackward0", "ViewBackward0", "TransposeBackward0",
    "CloneBackward0", "SplitBackward0", "CatBackward0", "SoftmaxBackward0", "torch::autograd::AccumulateGrad")) + (
    "aten::native_layer_norm_backward", "aten::silu_backward", "aten::gelu_backward",
    "aten::_scaled_dot_product_flash_attention_backward", "aten::_softmax_backward_data", "aten::add_",
    "aten::zeros_like", "aten::empty_like", "aten::fill_", "aten::detach", "aten::sum", "aten::mm", "aten::mul")
OPT_NAMES = ("aten::_foreach_mul_", "aten::_foreach_add_", "aten::_foreach_addcmul_", "aten::_foreach_sqrt",
             "aten::_foreach_div_", "aten::_foreach_addcdiv_", "aten::_foreach_lerp_", "aten::_foreach_norm")
COLL_NAMES = {"all_gather": ("c10d::_allgather_base_", "ncclDevKernel_AllGather_RING_LL"),
              "reduce_scatter": ("c10d::_reduce_scatter_base_", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"),
              "all_reduce": ("c10d::allreduce_", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
              "all_to_all": ("c10d::alltoall_base_", "ncclDevKernel_SendRecv"),
              "send": ("c10d::send", "ncclDevKernel_SendRecv"), "recv": ("c10d::recv_", "ncclDevKernel_SendRecv")}
NCCL_ARGS = "(ncclDevComm*, unsigned long, ncclWork*)"


def vocabulary(names: int) -> dict[int, list[str]]:
    """Op names per phase (0 forward, 1 backward, 2 optimizer), `names` in all: the real-looking ones, then more
    ``aten::`` names where `names` asks for more."""
    n_opt = max(names // 10, 2)
    n_fwd = max((names - n_opt) * 2 // 5, 2)
    n_bwd = max(names - n_opt - n_fwd, 2)

    def part(base: tuple[str, ...], n: int, tag: str) -> list[str]:
        return list(base[:n]) + [f"aten::{tag}_op_{i:04d}" for i in range(n - len(base[:n]))]

    return {0: part(FWD_NAMES, n_fwd, "fwd"), 1: part(BWD_NAMES, n_bwd, "bwd"), 2: part(OPT_NAMES, n_opt, "opt")}


#: A GEMM's or attention's share of a block's time against another op's: most of a large model's kernel time is in
#: its matrix multiplies, each hundreds of microseconds; the elementwise ops between them are a few microseconds.
HEAVY = 100.0


def _is_heavy(op: str) -> bool:
    return "gemm" in kernel_name(op) or "attention" in op.lower()


def kernel_name(op: str) -> str:
    short = op.rsplit(" ", 1)[-1].split("::")[-1].strip("_") or "op"
    if short in ("linear", "addmm", "matmul", "mm", "bmm", "MmBackward0", "AddmmBackward0"):
        return f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_{short}_kernel"
    return f"void at::native::vectorized_elementwise_kernel<4, at::native::{short}_functor<c10::BFloat16> >(int)"


def ops_per_compute(spec, items: list[Item]) -> int:
    """Ops per compute item, so that a step holds about --events / (steps x windows) events."""
    per_step = max(spec.events // (spec.steps * spec.windows), 50)
    comm = sum(4 + bool(it.label) for it in items if it.kind == "coll") + 3 * sum(
        1 for it in items if it.kind in ("send", "recv"))
    n_comp = sum(1 for it in items if it.kind == "compute")
    return max((per_step - comm - 8) // (3 * n_comp), 2)


@dataclass
class Truth:
    plan: Plan
    stages: list[StageTimes]
    name_of: dict[tuple[str, int], str]
    groups: dict[str, dict]  # name -> process group
    vocab: dict[int, list[str]]
    real: dict[int, int]  # phase -> how many of its names are real-looking ones (they come first)


def plan(spec, t0_ns: int):
    """(truth, process groups, columns) for synth.generate: the job simulated once, and the per-rank column
    builder that draws a rank-window's events from it."""
    p = make_plan(spec)
    pgs, name_of = process_groups(p)
    stages = simulate(p, spec, t0_ns)
    vocab = vocabulary(spec.names)
    real = {ph: min(len(v), len(base)) for (ph, v), base in zip(vocab.items(), (FWD_NAMES, BWD_NAMES, OPT_NAMES))}
    # what synth.write_rank reads of every rank (ranks are stage-major): step starts, and step ends for the clock
    # samples' times
    truth = {"start": np.concatenate([s.start for s in stages]),
             "end": np.concatenate([s.end for s in stages])[:, :, None],
             "shape": Truth(plan=p, stages=stages, name_of=name_of, groups={g["name"]: g for g in pgs},
                            vocab=vocab, real=real)}
    return truth, pgs, columns


class _Cols:
    """A rank-window's event columns, appended in blocks."""

    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in ("name_id", "kind", "tid", "device", "ts", "dur",
                                                                  "flops", "corr")}
        self.n = 0
        self.corr = 1

    def add(self, name_id, kind, tid, device, ts, dur, flops=0, corr=0) -> int:
        m = len(np.atleast_1d(ts))
        for k, v in (("name_id", name_id), ("kind", kind), ("tid", tid), ("device", device), ("ts", ts),
                     ("dur", dur), ("flops", flops), ("corr", corr)):
            self.cols[k].append(np.broadcast_to(np.asarray(v), (m,)).astype(np.int64))
        self.n += m
        return self.n - m

    def corrs(self, m: int) -> np.ndarray:
        self.corr += m
        return np.arange(self.corr - m, self.corr, dtype=np.int64)


@dataclass
class _Layout:
    """What every step of a rank-window repeats, with the window's string ids: per compute item its ops' names and
    kernels, per collective and transfer its names, stream and arguments."""

    comp: np.ndarray  # compute items
    op_ids: np.ndarray  # (compute items, ops per item) string ids
    k_ids: np.ndarray
    code: np.ndarray  # (compute items, ops per item) vocabulary code (flops for every third name)
    weight: np.ndarray  # (compute items, ops per item): a GEMM's or attention's share of the time, HEAVY x another's
    comp_tid: np.ndarray  # per compute item: the thread its ops run on (the backward's: the autograd engine's)
    coll_tid: np.ndarray  # per collective: the thread that issues it
    coll: np.ndarray  # collective items
    region: np.ndarray  # string id of the FSDP region around the enqueue, -1 none
    enq: np.ndarray
    kern: np.ndarray
    stream: np.ndarray
    rpc_args: list[CommArgs]  # without nccl_seq (torch's per-group number, set per step)
    k_args: list[CommArgs]
    seq_first: np.ndarray  # per collective: its number in its group at step 0 (it adds seq_step per step)
    seq_step: np.ndarray  # per collective: its group's collectives per step
    p2p: np.ndarray  # send / recv items
    p2p_enq: np.ndarray
    p2p_kern: np.ndarray
    p2p_args: list[CommArgs]


def _threads(items: list[Item], sel: np.ndarray) -> np.ndarray:
    """The backward runs on the autograd engine's thread (its ops, and the collectives its hooks issue: FSDP's
    gathers and reductions, DDP's buckets, TP's all-reduces), as in real traces; the rest on the main thread."""
    return np.array([BWD_TID if items[i].phase == 1 else MAIN_TID for i in sel.tolist()], np.int64)


def _layout(tr: Truth, rank: int, items: list[Item], n_op: int, strings) -> _Layout:
    kinds = np.array([it.kind for it in items])
    comp = np.flatnonzero(kinds == "compute")
    code = np.empty((comp.size, n_op), np.int64)
    for row, i in enumerate(comp.tolist()):
        it = items[i]
        first = tr.real[it.phase] // 2 if it.label == "mlp" else 0  # the MLP's ops: the second half of the real names
        first += (it.layer % 4) * max(n_op // 2, 1)  # four layer types, each with some ops of its own
        code[row] = (first + np.arange(n_op)) % len(tr.vocab[it.phase]) + 1000 * it.phase
    uniq = np.unique(code).tolist()
    op_lut = {u: strings.id(tr.vocab[u // 1000][u % 1000]) for u in uniq}
    k_lut = {u: strings.id(kernel_name(tr.vocab[u // 1000][u % 1000])) for u in uniq}
    heavy = {u: np.float64(HEAVY if _is_heavy(tr.vocab[u // 1000][u % 1000]) else 1.0) for u in uniq}
    coll = np.flatnonzero(kinds == "coll")
    p2p = np.flatnonzero((kinds == "send") | (kinds == "recv"))
    groups = [tr.groups[tr.name_of[(items[i].group, rank)]] for i in coll.tolist()]
    kind = [items[i].group for i in coll.tolist()]
    per_step = {k: kind.count(k) for k in set(kind)}
    ordinal = [kind[:x].count(k) for x, k in enumerate(kind)]
    return _Layout(
        comp=comp, comp_tid=_threads(items, comp), coll_tid=_threads(items, coll), op_ids=np.vectorize(op_lut.get, otypes=[np.int64])(code) if code.size else code,
        k_ids=np.vectorize(k_lut.get, otypes=[np.int64])(code) if code.size else code, code=code, coll=coll,
        weight=np.vectorize(heavy.get, otypes=[np.float64])(code) if code.size else code.astype(np.float64),
        region=np.array([strings.id(items[i].label) if items[i].label else -1 for i in coll.tolist()], np.int64),
        enq=np.array([strings.id(COLL_NAMES[items[i].op][0]) for i in coll.tolist()], np.int64),
        kern=np.array([strings.id(COLL_NAMES[items[i].op][1] + NCCL_ARGS) for i in coll.tolist()], np.int64),
        stream=np.array([STREAM_OF[items[i].group] for i in coll.tolist()], np.int64),
        rpc_args=[CommArgs(op=items[i].op, pg_name=g["name"], pg_desc=g["desc"], pg_ranks=g["ranks"],
                           bytes=items[i].nbytes, group_size=len(g["ranks"])) for i, g in zip(coll.tolist(), groups)],
        k_args=[CommArgs(op=items[i].op, bytes=items[i].nbytes) for i in coll.tolist()],
        seq_first=np.array(ordinal, np.int64), seq_step=np.array([per_step[k] for k in kind], np.int64),
        p2p=p2p, p2p_enq=np.array([strings.id(COLL_NAMES[items[i].op][0]) for i in p2p.tolist()], np.int64),
        p2p_kern=np.array([strings.id(COLL_NAMES[items[i].op][1] + NCCL_ARGS) for i in p2p.tolist()], np.int64),
        p2p_args=[CommArgs(op=items[i].op, bytes=items[i].nbytes) for i in p2p.tolist()])


def _compute(c: _Cols, strings, lay: _Layout, b: np.ndarray, e: np.ndarray, rng) -> None:
    """The compute items of one step: ops back to back on the main thread, each launching its kernel."""
    sel = lay.comp
    n_op = lay.code.shape[1]
    w = (0.3 + rng.lognormal(0.0, 0.6, lay.code.shape)) * lay.weight  # GEMMs and attention take most of the time
    span = np.maximum(e[sel] - b[sel] - 10 * US, n_op)
    least = np.clip(span // n_op, 1, 4 * US)  # every op at least this long, and all of them inside the item:
    # an op running into the next collective's enqueue would make its kernel that collective's
    d = least[:, None] + (w / w.sum(axis=1, keepdims=True) * (span - n_op * least)[:, None]).astype(np.int64)
    ts = (b[sel] + 5 * US)[:, None] + np.cumsum(d, axis=1) - d
    ts, d = ts.ravel(), d.ravel()
    tid = np.repeat(lay.comp_tid, n_op)
    cid = c.corrs(ts.size)
    c.add(lay.op_ids.ravel(), K["cpu_op"], tid, -1, ts, d - US, flops=(d * 1000) * (lay.code.ravel() % 3 == 0),
          corr=cid)
    # the kernels keep the compute stream busy, as a GPU-bound job's CPU running ahead does: 90-95 % of each op
    c.add(strings.id("cudaLaunchKernel"), K["cuda_runtime"], tid, -1, ts + d // 64, np.maximum(d // 64, 1),
          corr=cid)
    c.add(lay.k_ids.ravel(), K["kernel"], COMPUTE_STREAM, 0, ts + d // 32,
          np.maximum((d * rng.uniform(0.9, 0.95, d.size)).astype(np.int64), US), corr=cid)


def _collectives(c: _Cols, strings, lay: _Layout, step: int, b, k, e, meta: dict) -> None:
    """The collectives of one step: FSDP region, c10d enqueue, record_param_comms (with torch's sequence number in
    the group, as torch 2.x records it), launch, NCCL kernel."""
    sel = lay.coll
    if not sel.size:
        return
    t = b[sel]
    lab = lay.region >= 0
    if lab.any():
        c.add(lay.region[lab], K["user_annotation"], lay.coll_tid[lab], -1, t[lab], 34 * US)
        t = t + 2 * US * lab
    cid = c.corrs(sel.size)
    c.add(lay.enq, K["cpu_op"], lay.coll_tid, -1, t, 25 * US)
    j = c.add(strings.id("record_param_comms"), K["cpu_op"], lay.coll_tid, -1, t + 2 * US, 20 * US)
    seq = (lay.seq_first + step * lay.seq_step).tolist()
    meta.update((j + x, CommArgs(op=a.op, pg_name=a.pg_name, pg_desc=a.pg_desc, pg_ranks=a.pg_ranks, bytes=a.bytes,
                                 group_size=a.group_size, nccl_seq=sq))
                for x, (a, sq) in enumerate(zip(lay.rpc_args, seq)))
    c.add(strings.id("cudaLaunchKernel"), K["cuda_runtime"], lay.coll_tid, -1, t + 5 * US, 6 * US, corr=cid)
    j = c.add(lay.kern, K["kernel"], lay.stream, 0, k[sel], e[sel] - k[sel], corr=cid)
    meta.update(zip(range(j, j + sel.size), lay.k_args))


def _transfers(c: _Cols, strings, tr: Truth, rank: int, step: int, items: list[Item], lay: _Layout, b, k, e,
               meta: dict, calls: list) -> None:
    """The sends and receives of one step, with the calls the capture records (peer, group, number)."""
    sel = lay.p2p
    if not sel.size:
        return
    p = tr.plan
    t = b[sel]
    pg = tr.name_of[("pp", rank)]
    calls.extend((int(x) - US, MAIN_TID, items[i].kind == "recv", rank + items[i].peer * p.stage_size, pg,
                  step * p.micro + items[i].tag[1]) for x, i in zip(t.tolist(), sel.tolist()))
    cid = c.corrs(sel.size)
    c.add(lay.p2p_enq, K["cpu_op"], MAIN_TID, -1, t, 15 * US)
    c.add(strings.id("cudaLaunchKernel"), K["cuda_runtime"], MAIN_TID, -1, t + 3 * US, 6 * US, corr=cid)
    j = c.add(lay.p2p_kern, K["kernel"], STREAM_OF["pp"], 0, k[sel], e[sel] - k[sel], corr=cid)
    meta.update(zip(range(j, j + sel.size), lay.p2p_args))


def _memory(items: list[Item], comp: np.ndarray, b: np.ndarray, e: np.ndarray, micro: int):
    """A step's allocations: each forward block saves its activations (freed when its backward ends) and each block
    allocates a temporary it frees two thirds in: the curve rises through the forward and falls through the backward."""
    phase = np.array([items[i].phase for i in comp.tolist()])
    act = int(64 * MB * min(1.0, 4.0 / micro))
    tmp = act // 2
    bb, ee = b[comp], e[comp]
    keep = phase < 2
    saved_ts = np.where(phase == 0, bb, ee)[keep]
    saved = np.where(phase == 0, act, -act)[keep]
    ts = np.concatenate([saved_ts, bb + (ee - bb) // 3, bb + 2 * (ee - bb) // 3])
    delta = np.concatenate([saved, np.full(comp.size, tmp), np.full(comp.size, -tmp)])
    o = np.argsort(ts, kind="stable")
    return ts[o], delta[o]


def columns(spec, rank: int, window: int, truth: dict, pgs, strings):
    """One rank-window's events (true clock): build_tables columns, collective arguments, memory samples, and the
    build_tables keywords (stream names, point-to-point calls)."""
    tr: Truth = truth["shape"]
    p = tr.plan
    s, j = divmod(rank, p.stage_size)
    st = tr.stages[s]
    items = st.items
    n_op = ops_per_compute(spec, items)
    lay = _layout(tr, rank, items, n_op, strings)
    opt = lay.comp[-1]
    rng = np.random.default_rng(spec.seed * 100_003 + rank * 101 + window)
    c, meta, calls, mem_ts, mem_b = _Cols(), {}, [], [], []
    for step in range(window * spec.steps, (window + 1) * spec.steps):
        t0, t1 = int(st.start[j, step]), int(st.end[j, step])
        b, k, e = (t0 + a[j, step].astype(np.int64) for a in (st.begin, st.kstart, st.kend))
        c.add(strings.id(f"ProfilerStep#{step + 2}"), K["user_annotation"], MAIN_TID, -1, t0, t1 - t0)
        _compute(c, strings, lay, b, e, rng)
        _collectives(c, strings, lay, step, b, k, e, meta)
        _transfers(c, strings, tr, rank, step, items, lay, b, k, e, meta, calls)
        c.add(strings.id("Optimizer.step#AdamW.step"), K["user_annotation"], MAIN_TID, -1, int(b[opt]),
              int(e[opt] - b[opt]))
        m_ts, m_b = _memory(items, lay.comp, b, e, p.micro)
        mem_ts.append(m_ts)
        mem_b.append(m_b)
    cols = {key: np.concatenate(v) for key, v in c.cols.items()}
    streams = {(0, COMPUTE_STREAM): "stream 7"}
    streams.update({(0, STREAM_OF[g]): f"stream {STREAM_OF[g]} nccl {g}" for g in _kinds(p)})
    extra: dict[str, Any] = {"stream_names": streams}
    if calls:
        extra["p2p_calls"] = P2PCalls.from_rows(calls)
    return cols, meta, np.concatenate(mem_ts), np.concatenate(mem_b), extra
