"""What an event *is*, from its name, Kineto category and arguments: the single place for GPU/communication semantics.

Used by capture (``distprof.capture.extract``) and by ``distprof import`` (``distprof.importers.kineto``) so that a
shard means the same whichever way it was made. Documented for users in docs/gpu-semantics.md.

* :func:`comm_role` — exec (does the transfer: ``gloo:*`` on worker threads, NCCL/RCCL kernels, kernels of
  communication libraries such as DeepEP or NVSHMEM), enqueue (``c10d::*``, ``nccl:*`` and the functional collectives
  ``_c10d_functional::*`` — their ``wait_tensor`` included — on the calling thread), annotation
  (``record_param_comms``), or 0.
* :func:`normalize_op` — canonical collective name (``all_reduce``, ``all_to_all``, ``send_recv``, …).
* :func:`categorize` — category column (compute / communication / memcpy / other) from kinds and roles.
* :func:`comm_args` — collective metadata Kineto writes into ``args`` (``Collective name``, ``In msg nelems``,
  ``dtype``, ``Process Group Name``, ``Group size``, ``Seq``, …).

Communication kernels of libraries other than NCCL/RCCL are recognised, in this order, by regular expressions searched
in the kernel name — :data:`DEFAULT_COMM_KERNEL_PATTERNS` plus the user's ``DISTPROF_COMM_KERNELS`` (``;``-separated
``REGEX`` or ``REGEX=op`` entries) — then by whole words of the name (:func:`comm_kernel_words`): a collective's name
spelt as words (``all_reduce``, ``AllGather``, ``reduce-scatter``, ``all_to_all``, ``a2a``, ``send_recv``), or an
expert-parallel ``dispatch``/``combine`` next to an expert-parallel word (``ep``, ``moe``, ``expert``, ``intranode``,
``internode``, ``nvl``, ``rdma``, ``notify``). Single words that compute kernels also use (``reduce``, ``gather``,
``scatter``, ``Dispatch`` in ``cub::DispatchReduceByKey``) never count: on the 276 distinct kernel names of the
shared real traces the words add no false positive. A kernel whose launch lies inside a communication op on the CPU
(``c10d::*``, ``nccl:*``, ``record_param_comms``) is communication too (``events.tables``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError
from ..storage import schema

log = logging.getLogger(__name__)

__all__ = [
    "CommArgs", "comm_args", "comm_role", "normalize_op", "categorize", "is_nccl_kernel", "comm_kernel_op",
    "comm_kernel_patterns", "DTYPE_BYTES", "DEVICE_KINDS", "ENV_COMM_KERNELS", "DEFAULT_COMM_KERNEL_PATTERNS",
]

#: Environment variable with extra communication-kernel patterns: ``REGEX[=op];REGEX[=op];...``.
ENV_COMM_KERNELS = "DISTPROF_COMM_KERNELS"

#: (regex searched in a GPU kernel's name, collective op) for communication libraries with their own kernels.
DEFAULT_COMM_KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"deep_ep::", "all_to_all"),  # DeepEP expert-parallel dispatch/combine (intranode::, internode::, internode_ll::)
    (r"^nvshmem|[^A-Za-z]nvshmem", "nvshmem"),  # NVSHMEM device collectives / barriers (nvshmemi_*, nvshmemx_*)
    (r"pplx", "all_to_all"),  # pplx-kernels all-to-all dispatch/combine
    (r"^cross_device_reduce|vllm::cross_device_reduce", "all_reduce"),  # vLLM custom all-reduce
)

#: Kineto kinds that run on a device stream (kernel, copies, sets, synchronisation, GPU-side annotations).
DEVICE_KINDS = frozenset(schema.KIND_CODE[k] for k in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync",
                                                          "gpu_user_annotation"))

DTYPE_BYTES = {
    # C++ names (torch's Input type / _KinetoEvent.dtypes())
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long": 8, "long int": 8, "int": 4, "short": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "unsigned short": 2, "unsigned int": 4,
    # ScalarType names (record_param_comms "dtype")
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "UInt16": 2,
    "UInt32": 4, "UInt64": 8,
}

_COLL_ALIASES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor":
    "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter", "allgather": "all_gather",
    "all_gather": "all_gather", "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather", "allgather_coalesced": "all_gather",
    "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all", "all_to_all": "all_to_all", "all_to_allv": "all_to_all",
    "all_to_all_single": "all_to_all", "send": "send", "recv": "recv", "recv_": "recv", "gather": "gather",
    "scatter": "scatter", "sendrecv": "send_recv", "send_recv": "send_recv", "allreduce_coalesced": "all_reduce",
    "recv_any_source": "recv", "all_reduce_coalesced": "all_reduce",
}
#: NCCL/RCCL kernels: ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (NCCL >= 2.19, RCCL), rccl*.
_NCCL_RE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)


@functools.lru_cache(maxsize=8)
def _compiled_patterns(env_value: str) -> tuple[tuple[re.Pattern, str], ...]:
    out = [(re.compile(p), op) for p, op in DEFAULT_COMM_KERNEL_PATTERNS]
    for item in env_value.split(";"):
        item = item.strip()
        if not item:
            continue
        pat, _, op = item.partition("=") if re.search(r"=[A-Za-z_]+$", item) else (item, "", "")
        try:
            out.append((re.compile(pat), op.strip() or "comm_kernel"))
        except re.error as e:
            raise ConfigError(f"{ENV_COMM_KERNELS}: {pat!r} is not a regular expression ({e}); "
                              "use ';'-separated REGEX or REGEX=op entries") from None
    return tuple(out)


def comm_kernel_patterns() -> tuple[tuple[re.Pattern, str], ...]:
    """Compiled (pattern, op) list: the defaults plus ``DISTPROF_COMM_KERNELS``."""
    return _compiled_patterns(os.environ.get(ENV_COMM_KERNELS, ""))


def is_nccl_kernel(name: str) -> bool:
    return _NCCL_RE.match(name) is not None


def comm_kernel_op(name: str) -> str:
    """Op of a communication-library kernel matched by a pattern or by its words ('' when neither matches).
    NCCL/RCCL kernels are not included (``comm_role`` knows them by name)."""
    for pat, op in comm_kernel_patterns():
        if pat.search(name):
            return op
    return comm_kernel_words(name)


_WORD_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
#: Collectives spelt as one or more consecutive words of a kernel name (lower case, joined) -> op.
_COLLECTIVE_WORDS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                     "alltoall": "all_to_all", "alltoallv": "all_to_all", "a2a": "all_to_all", "sendrecv": "send_recv"}
_EP_ACTIONS = frozenset({"dispatch", "combine"})
_EP_CONTEXT = frozenset({"ep", "moe", "expert", "experts", "intranode", "internode", "nvl", "rdma", "notify", "deepep"})


@functools.lru_cache(maxsize=65536)
def comm_kernel_words(name: str) -> str:
    """Op of a kernel whose words name communication ('' when they do not): see the module docstring."""
    words = [w.lower() for w in _WORD_RE.findall(name)]
    for i in range(len(words)):
        joined = ""
        for w in words[i:i + 3]:  # up to three words: all_to_all, reduce_scatter
            joined += w
            op = _COLLECTIVE_WORDS.get(joined)
            if op:
                return op
    if _EP_ACTIONS & set(words) and _EP_CONTEXT & set(words):
        return "all_to_all"  # expert-parallel token exchange
    return ""


def _camel_to_snake(s: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower()


#: Functional collectives (DTensor, tensor parallel, torch.compile): ``_c10d_functional::all_reduce``, ``wait_tensor``.
_FUNCTIONAL = ("_c10d_functional::", "c10d_functional::", "_c10d_functional_autograd::")


def normalize_op(name: str) -> str:
    """Canonical collective name of a communication event name ('' when not a collective)."""
    if name.startswith(("gloo:", "nccl:")):
        base = name[5:]
    elif name.startswith("c10d::"):
        base = name[6:].rstrip("_")
    elif name.startswith(_FUNCTIONAL):
        base = name.split("::", 1)[1].rstrip("_")
        if base.startswith("wait"):
            return ""
    else:
        m = _NCCL_RE.match(name)
        if not m:
            return ""
        base = _camel_to_snake(m.group(1))
    key = base.strip("_").lower()
    return _COLL_ALIASES.get(key, _COLL_ALIASES.get(key.replace("_", ""), key))


def comm_role(name: str, kind: int | None = None) -> int:
    """Role of an event in communication: exec / enqueue / annotation, or 0 when it is not communication.

    `kind` (a ``schema.KIND_CODE`` value) restricts library-kernel patterns to device kernels; without it only
    name prefixes are used.
    """
    if name.startswith("gloo:") or _NCCL_RE.match(name):
        return schema.ROLE_EXEC
    if name.startswith(("c10d::", "nccl:")) or name.startswith(_FUNCTIONAL):
        return schema.ROLE_ENQUEUE
    if name == "record_param_comms":
        return schema.ROLE_ANNOTATION
    if kind == schema.KIND_CODE["kernel"] and comm_kernel_op(name):
        return schema.ROLE_EXEC
    return 0


def categorize(kind: np.ndarray, role: np.ndarray) -> np.ndarray:
    """Category per event: communication (any role), memcpy (``gpu_memcpy``/``gpu_memset``), compute (``cpu_op``,
    ``kernel``), else other (annotations, Python functions, runtime/driver calls, ``cuda_sync``)."""
    kind = np.asarray(kind)
    category = np.full(kind.shape, schema.CAT_OTHER, np.uint8)
    category[(kind == schema.KIND_CODE["cpu_op"]) | (kind == schema.KIND_CODE["kernel"])] = schema.CAT_COMPUTE
    category[(kind == schema.KIND_CODE["gpu_memcpy"]) | (kind == schema.KIND_CODE["gpu_memset"])] = schema.CAT_MEMCPY
    category[np.asarray(role) > 0] = schema.CAT_COMM
    return category


@dataclass
class CommArgs:
    """Collective metadata from an event's arguments; None where the trace does not say."""

    op: str | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    bytes: int | None = None
    group_size: int | None = None
    nccl_seq: int | None = None

    def merged(self, other: "CommArgs | None") -> "CommArgs":
        """Own values, filled from `other` where missing."""
        if other is None:
            return self
        return CommArgs(**{k: (v if v is not None else getattr(other, k)) for k, v in vars(self).items()})


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _ranks(v: Any) -> list[int] | None:
    if isinstance(v, list):
        return [int(x) for x in v if _as_int(x) is not None]
    if isinstance(v, str) and v.startswith("["):
        try:
            return [int(x) for x in json.loads(v)]
        except (ValueError, TypeError):
            return None
    return None


def message_bytes(dims: Any, types: Any) -> int | None:
    """Bytes of the tensors an op received, from Kineto's ``Input Dims`` and ``Input type`` (None when unknown)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total, seen = 0, False
    for shape, dt in zip(dims, types):
        size = DTYPE_BYTES.get(dt) if isinstance(dt, str) else None
        if size is None or not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            continue
        total += int(np.prod(shape)) * size
        seen = True
    return total if seen else None


def comm_args(args: Mapping[str, Any] | None) -> CommArgs | None:
    """Collective metadata from a Kineto ``args`` dict (record_param_comms, NCCL kernels), None when it has none.

    Bytes: ``max(In msg nelems, Out msg nelems) × dtype size`` — the larger side is what crosses the wire for
    all-gather / reduce-scatter; else the ``Input Dims``/``Input type`` of older traces.
    """
    if not args:
        return None
    coll = args.get("Collective name")
    nbytes = None
    size = DTYPE_BYTES.get(args.get("dtype")) if isinstance(args.get("dtype"), str) else None
    n_in, n_out = _as_int(args.get("In msg nelems")), _as_int(args.get("Out msg nelems"))
    if size is not None and (n_in is not None or n_out is not None):
        nbytes = max(n_in or 0, n_out or 0) * size
    elif "Input Dims" in args:
        nbytes = message_bytes(args.get("Input Dims"), args.get("Input type"))
    pg = args.get("Process Group Name")
    out = CommArgs(
        op=normalize_op("c10d::" + coll) if isinstance(coll, str) and coll else None,
        pg_name=str(pg) if pg is not None and pg != "" else None,
        pg_desc=str(args["Process Group Description"]) if "Process Group Description" in args else None,
        pg_ranks=_ranks(args.get("Process Group Ranks")),
        bytes=nbytes,
        group_size=_as_int(args.get("Group size")),
        nccl_seq=_as_int(args.get("Seq")),
    )
    if all(v is None for v in vars(out).values()):
        return None
    return out
