"""The job's parallelism: which styles it uses (DDP, FSDP / FSDP2, TP, PP, EP), its mesh, and its groups.

Read from what the trace shows, each style with its evidence:

* **DDP** — ``DistributedDataParallel.forward`` regions, or all-reduces (with no FSDP) on a data-parallel group;
* **FSDP2** — ``FSDP::`` regions (``fully_shard``); **FSDP** — ``FullyShardedDataParallel`` regions (FSDP1);
* **TP** — a tensor/sequence-parallel mesh dimension (``mesh_tp``, ``mesh_sp``, ``mesh_cp``) with collectives, or
  functional collectives (``_c10d_functional::``, DTensor) outside any FSDP group;
* **PP** — ranks that send to each other (``pipeline.pipelines``), or ``PipelineStage`` regions;
* **EP** — all-to-alls (MoE dispatch and combine), or an expert mesh dimension (``mesh_ep``);
* **ZeRO-1 / -2 / -3** — the DeepSpeed engine's data-parallel group, tagged with its stage by the capture
  (``capture/frameworks.py``: a trace cannot tell ZeRO-1 from ZeRO-2), with that group's collectives; without the
  tag, ZeRO-3 from its parameter hooks' regions (``LinearFunctionForZeroStage3``, ``PreBackwardFunctionForModule``).

The **mesh** is the DeviceMesh dimensions the groups name (``mesh_<dim>``), with their sizes; **groups** are the
group kinds of :mod:`.comm_table` with their size and role. :func:`advice_for_exposed` gives the exposed
communication finding advice that fits the collectives that are exposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...record import Record, omit_if_none
from .comm_table import CommRow, group_kind

if TYPE_CHECKING:
    from ..types import RunSummary
    from .pipeline import Pipeline

__all__ = ["Parallelism", "detect_parallelism", "advice_for_exposed", "dim_role"]

_ROLES = {"dp": "data", "ddp": "data", "fsdp": "data", "dp_shard": "data", "dp_replicate": "data",
          "replicate": "data", "shard": "data", "dp_cp": "data", "tp": "tensor", "sp": "tensor", "cp": "context",
          "pp": "pipeline", "ep": "expert", "moe": "expert"}


def dim_role(dim: str) -> str:
    """``dp`` -> data, ``tp`` -> tensor, ``pp`` -> pipeline, ``ep`` -> expert, ``cp`` -> context ('' unknown)."""
    d = dim.lower()
    return _ROLES.get(d) or next((r for k, r in _ROLES.items() if d.endswith("_" + k) or d.startswith(k + "_")), "")


@dataclass
class ZeroSettings(Record):
    """DeepSpeed ZeRO's stage and the settings its engine gave at the optimizer step (``capture.frameworks``); a
    setting the engine did not give is None (and left out of the JSON)."""

    stage: int
    framework: str = "deepspeed"
    overlap_comm: bool | None = omit_if_none()
    contiguous_gradients: bool | None = omit_if_none()
    reduce_bucket_size: int | float | None = omit_if_none()
    allgather_bucket_size: int | float | None = omit_if_none()
    prefetch_bucket_size: int | float | None = omit_if_none()

    @classmethod
    def of(cls, tag: Any) -> ZeroSettings | None:
        """The settings from a shard's ``zero`` tag (JSON from a file: anything of the wrong type reads as unknown);
        None when it names no stage 1..3."""
        if not isinstance(tag, dict) or not isinstance(tag.get("stage"), int) or not 1 <= tag["stage"] <= 3:
            return None

        def num(k: str) -> int | float | None:
            v = tag.get(k)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def flag(k: str) -> bool | None:
            return tag[k] if isinstance(tag.get(k), bool) else None

        return cls(stage=tag["stage"], overlap_comm=flag("overlap_comm"),
                   contiguous_gradients=flag("contiguous_gradients"), reduce_bucket_size=num("reduce_bucket_size"),
                   allgather_bucket_size=num("allgather_bucket_size"), prefetch_bucket_size=num("prefetch_bucket_size"))


@dataclass
class ParallelGroup(Record):
    """One group kind of the job (:func:`.comm_table.group_kind`): how many groups, their size, role and ops."""

    kind: str
    count: int
    size: int
    role: str  # data, tensor, context, pipeline, expert, world, or '' (unknown)
    ops: list[str] = field(default_factory=list)  # the collective ops run on it
    zero: ZeroSettings | None = omit_if_none()  # the DeepSpeed ZeRO engine's data-parallel group


@dataclass
class Parallelism(Record):
    styles: list[str]  # e.g. ["FSDP2", "TP"], in the order DDP, FSDP, FSDP2, ZeRO-n, TP, PP, EP
    evidence: dict[str, str]  # style -> what showed it
    mesh: dict[str, int] = field(default_factory=dict)  # DeviceMesh dimension -> size
    groups: list[ParallelGroup] = field(default_factory=list)

    @property
    def label(self) -> str:
        mesh = " x ".join(f"{d}={n}" for d, n in self.mesh.items())
        return (" + ".join(self.styles) or "no parallelism recognised") + (f" (mesh {mesh})" if mesh else "")

    def _json_extra(self) -> dict[str, Any]:
        return {"label": self.label}


def _names(run: RunSummary) -> set[str]:
    out: set[str] = set()
    for s in run.ranks.values():
        out.update(str(k) for k in s.annotations)
        out.update(str(n) for n in s.op_names)
    return out


def detect_parallelism(run: RunSummary, table: list[CommRow], pipes: list[Pipeline]) -> Parallelism:
    names = _names(run)
    ops_by_kind: dict[str, set[str]] = {}
    for r in table:
        ops_by_kind.setdefault(r.group, set()).add(r.op)
    mesh: dict[str, int] = {}
    groups = []
    for g in run.process_groups:
        kind = group_kind(g)
        if kind.startswith("mesh_"):
            mesh.setdefault(kind[5:], len(g.get("ranks") or []))
    for kind in sorted({group_kind(g) for g in run.process_groups}):
        members = [g for g in run.process_groups if group_kind(g) == kind]
        role = dim_role(kind[5:]) if kind.startswith("mesh_") else ("world" if kind == "default_pg" else "")
        groups.append(ParallelGroup(kind=kind, count=len(members), size=max(len(g.get("ranks") or []) for g in members),
                                    role=role, ops=sorted(ops_by_kind.get(kind, ())),
                                    zero=ZeroSettings.of(members[0].get("zero"))))
    ev: dict[str, str] = {}
    zero = _zero_evidence(groups, names)
    ev.update(zero)
    fsdp2 = sorted(n for n in names if n.startswith("FSDP::"))
    fsdp1 = sorted(n for n in names if "FullyShardedDataParallel" in n)
    if fsdp2:
        ev["FSDP2"] = f"fully_shard regions ({fsdp2[0]}, {len(fsdp2)} kinds)"
    if fsdp1:
        ev["FSDP"] = f"FullyShardedDataParallel regions ({fsdp1[0]})"
    ddp = sorted(n for n in names if n.startswith("DistributedDataParallel"))
    if ddp:
        ev["DDP"] = f"{ddp[0]} regions"
    elif not (fsdp1 or fsdp2 or zero) and any("all_reduce" in ops for k, ops in ops_by_kind.items()
                                      if k == "default_pg" or (k.startswith("mesh_") and dim_role(k[5:]) == "data")):
        ev["DDP"] = "all-reduces on the data-parallel group (no FSDP regions)"
    tp_dims = [d for d in mesh if dim_role(d) in ("tensor", "context") and ops_by_kind.get(f"mesh_{d}")]
    if tp_dims:
        ev["TP"] = f"collectives on the mesh's {', '.join(tp_dims)} dimension ({', '.join(sorted(ops_by_kind[f'mesh_{tp_dims[0]}']))})"
    elif any(n.startswith("_c10d_functional::") for n in names) and not (fsdp1 or fsdp2):
        ev["TP"] = "functional collectives (DTensor / tensor parallel)"
    if pipes:
        ev["PP"] = f"{len(pipes[0].stages)} stages exchanging activations ({' -> '.join(map(str, pipes[0].ranks))})"
    elif any("PipelineStage" in n or "pipelining" in n for n in names):
        ev["PP"] = "torch.distributed.pipelining regions"
    a2a = [k for k, ops in ops_by_kind.items() if "all_to_all" in ops]
    if a2a or any(dim_role(d) == "expert" for d in mesh):
        ev["EP"] = f"all-to-alls on {', '.join(a2a)}" if a2a else "an expert mesh dimension"
    order = ["DDP", "FSDP", "FSDP2", "ZeRO-1", "ZeRO-2", "ZeRO-3", "TP", "PP", "EP"]
    return Parallelism(styles=[s for s in order if s in ev], evidence=ev, mesh=mesh, groups=groups)


#: Region names of DeepSpeed ZeRO-3's parameter hooks (autograd functions around each module), seen in any trace.
ZERO3_REGIONS = ("LinearFunctionForZeroStage3", "PreBackwardFunctionForModule", "PostBackwardFunctionModule")


def _zero_evidence(groups: list[ParallelGroup], names: set[str]) -> dict[str, str]:
    """{"ZeRO-<stage>": what showed it}: the group the capture tagged with DeepSpeed's stage, else ZeRO-3's regions."""
    for g in groups:
        if g.zero is not None:
            ops = f" ({', '.join(g.ops)})" if g.ops else ""
            return {f"ZeRO-{g.zero.stage}": f"DeepSpeed engine at ZeRO stage {g.zero.stage} on {g.kind}{ops}"}
    seen = sorted(n for n in names if n in ZERO3_REGIONS)
    return {"ZeRO-3": f"DeepSpeed ZeRO-3 parameter hooks ({', '.join(seen)})"} if seen else {}


def _zero_advice(par: Parallelism) -> str | None:
    """The exposed-communication advice for a DeepSpeed ZeRO job, naming its settings where the capture read them."""
    stage = next((int(s[5:]) for s in par.styles if s.startswith("ZeRO-")), None)
    if stage is None:
        return None
    z = next((g.zero for g in par.groups if g.zero is not None), None)

    def now(key: str) -> str:
        v = getattr(z, key) if z is not None else None
        return "" if v is None else f" (now {'on' if v is True else 'off' if v is False else f'{v:,}'})"

    if stage == 3:
        return ("The exposed time is DeepSpeed ZeRO-3's parameter all-gathers and gradient reduce-scatters waiting: "
                f"keep overlap_comm on{now('overlap_comm')}, prefetch further ahead with a larger "
                f"stage3_prefetch_bucket_size{now('prefetch_bucket_size')}, raise reduce_bucket_size"
                f"{now('reduce_bucket_size')} for fewer, fuller reduce-scatters, keep contiguous_gradients on"
                f"{now('contiguous_gradients')}, keep small parameters whole (stage3_param_persistence_threshold), and "
                "choose ZeRO-2 when the parameters fit without sharding: it drops the per-layer all-gathers.")
    return (f"The exposed time is DeepSpeed ZeRO-{stage}'s gradient reduction and parameter all-gather waiting: set "
            f"overlap_comm: true{now('overlap_comm')} to reduce gradients during the backward pass, tune "
            f"reduce_bucket_size{now('reduce_bucket_size')} and allgather_bucket_size{now('allgather_bucket_size')} "
            "(larger: fewer, fuller collectives; smaller: the first ones start earlier), keep contiguous_gradients on"
            f"{now('contiguous_gradients')}, and choose the stage by memory: ZeRO-1 and ZeRO-2 send the same volume "
            "(ZeRO-2 also shards the gradients), ZeRO-3 adds an all-gather of the parameters in every forward and "
            "backward, so move up a stage only when the model does not fit.")


def advice_for_exposed(par: Parallelism | None, table: list[CommRow]) -> str:
    """Advice for exposed communication that fits the collectives whose time is exposed the most."""
    top = next((r for r in table if r.exposed_ms_per_step > 0), None)
    styles = set(par.styles) if par else set()
    role = dim_role(top.group[5:]) if top and top.group.startswith("mesh_") else ""
    if top is not None and top.op == "all_to_all":
        return ("The exposed time is mostly all-to-all (expert parallelism): overlap dispatch and combine with expert "
                "compute (micro-batch the MoE layer, a comm stream), keep experts within a node where possible, and "
                "balance tokens per expert (capacity factor, auxiliary load-balancing loss).")
    if top is not None and (role in ("tensor", "context") or ("TP" in styles and top.op == "all_reduce"
                                                                 and "FSDP2" in styles and role != "data")):
        return (f"The exposed time is mostly {top.op} on {top.group} (tensor parallelism): keep tensor-parallel groups "
                "inside a node (NVLink), use sequence parallelism (SequenceParallel) so activations are reduce-"
                "scattered instead of all-reduced, and async TP (torch._inductor.config._micro_pipeline_tp = True with "
                "torch.compile) to overlap them with the matmuls.")
    zero = _zero_advice(par) if par is not None else None
    if zero is not None:
        return zero
    if {"FSDP", "FSDP2"} & styles:
        return ("The exposed time is FSDP's all-gathers and reduce-scatters waiting: prefetch further ahead "
                "(FSDP2: module.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; FSDP1: "
                "forward_prefetch=True, backward_prefetch=BACKWARD_PRE), keep the root and small last modules "
                "unsharded after forward (reshard_after_forward=False) to skip their backward all-gather, wrap in "
                "fewer, larger units, and use bf16 mixed precision for the gathered parameters.")
    return ("Overlap communication with the backward pass and send less of it: tune DDP bucket_cap_mb (larger "
            "buckets mean fewer collectives; smaller first buckets start earlier), keep gradient_as_bucket_view=True "
            "and avoid find_unused_parameters, accumulate gradients over several micro-batches under model.no_sync(), "
            "and compress or shard (bf16 gradients, FSDP/ZeRO) when the network is the limit.")
