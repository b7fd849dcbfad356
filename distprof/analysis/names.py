"""Short display forms of trace names and rank lists, for sentences and tables (the data keeps the full names).

GPU kernel names are demangled C++ signatures that can run to thousands of characters (fbgemm, cutlass); a sentence
or a table cell shows ``split_embedding_backward_codegen_..._kernel<…>(…)`` instead.
"""

from __future__ import annotations

import re
from typing import Iterable

__all__ = ["display_name", "rank_ranges"]


def _collapse(text: str, open_: str, close: str, keep: str) -> str:
    """Replace every outermost ``open_ ... close`` group by ``open_ + keep + close``; unbalanced text is kept."""
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            if depth == 0:
                out.append(open_ + keep)
            depth += 1
        elif ch == close and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(close)
        elif depth == 0:
            out.append(ch)
    return "".join(out) if depth == 0 else text


def display_name(name: str, limit: int = 80) -> str:
    """A readable form of `name` of at most `limit` characters.

    Short names are returned unchanged. Longer ones lose ``void `` prefixes, template arguments (``<…>``) and
    parameter lists (``(…)``), then the middle is elided with ``…``.
    """
    name = str(name)
    if len(name) <= limit:
        return name
    s = name[5:] if name.startswith("void ") else name
    s = _collapse(s, "(", ")", "…")
    s = _collapse(s, "<", ">", "…")
    if len(s) <= limit:
        return s
    keep = max(limit - 1, 2)
    head = (keep + 1) // 2
    return s[:head] + "…" + s[len(s) - (keep - head):]


def rank_ranges(ranks: Iterable[int], sep: str = ", ") -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (``sep=","`` gives the ``--ranks`` syntax ``"0-2,5,7-8"``)."""
    rs = sorted({int(r) for r in ranks})
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return sep.join(parts)


#: Runtime/driver calls that block the host until device work completes: the explicit synchronisations and the
#: synchronous copies (``cudaMemcpy``, HIP's ``hipMemcpyWithStream`` - what a ``non_blocking=False`` copy calls on
#: ROCm; on CUDA such a copy is ``cudaMemcpyAsync`` + ``cudaStreamSynchronize``). Suffixes ``_v2``/``_ptsz``/``_ptds``.
SYNC_CALL_RE = re.compile(
    r"^(?:(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx)Synchronize"
    r"|(?:cuda|hip)Memcpy(?:2D|3D|Peer|ToSymbol|FromSymbol|WithStream)?"
    r"|cuMemcpy(?:DtoH|HtoD|DtoD|Peer)?)(?:_v\d+)?(?:_ptsz|_ptds|_spt)?$")


def is_sync_call(name: str) -> bool:
    """Whether a runtime/driver call name blocks the host (see ``SYNC_CALL_RE``)."""
    return SYNC_CALL_RE.match(name) is not None


STEP_PREFIX = "ProfilerStep#"


DATALOADER_PREFIX = "enumerate(DataLoader)#"


FRAMEWORK_PREFIXES = (
    "ProfilerStep#",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
    "enumerate(DataLoader)#",
    "DistributedDataParallel.",
    "FullyShardedDataParallel.",
    "Torch-Compiled Region",
    "CompiledFunction",
    "## ",
    "gloo:",
    "nccl:",
    "record_param_comms",
    "PyTorch Profiler",
)


def is_user_annotation_name(name: str) -> bool:
    """True unless `name` is a framework-internal region (see ``FRAMEWORK_PREFIXES``)."""
    return not str(name).startswith(FRAMEWORK_PREFIXES)
