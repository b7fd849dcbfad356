"""Keep torch.compile out of distprof's hooks.

distprof's hooks run inside the user's code: the global optimizer-step hooks and the module forward pre-hook that
place the step boundary (:mod:`.stepper`), the watch's optimizer and gradient hooks and its timed waits
(:mod:`.watch`, :mod:`.syncpoints`). When the user compiles the code that calls them — ``model.compile()`` (the
module's own ``_call_impl`` compiled, global hooks included), a compiled ``opt.step`` (PyTorch's "compiling the
optimizer" recipe), compiled autograd — Dynamo would trace them like the user's code: graph breaks at every clock
and ``/proc`` read, distprof's numpy turned into tensors, its functions compiled as frames of their own (a 2-rank
DDP job under ``model.compile()``: 22 compiled frames without distprof, 113–142 with it), and whatever a trace holds
on to replayed instead of run.

So each such hook is registered as an :func:`opaque` trampoline, which calls the hook until the job compiles
something and the hook wrapped by ``torch.compiler.disable`` from then on (about 0.4 µs more per call). Dynamo does
not trace a disabled function: a trace that reaches it breaks the graph there, and the compiled code calls the hook
eagerly each time it passes, as the job would without compile. Nor does Dynamo compile the frames a disabled function
runs: a hook called from the eager part of compiled code (a graph break's call, a frame Dynamo chose to skip) would
otherwise have its own frames compiled, on the spot. A wait that distprof only times (the watch's wrappers) is
instead traced as the original call, untimed (``torch.compiler.is_compiling()`` is True while Dynamo traces): inside
a compiled graph it is the graph's own op.

``torch._dynamo`` takes about a second to import, which a job that never compiles should not pay: the disabled
wrappers are made (:func:`seal`) at :func:`install` when ``torch._dynamo`` is already imported, else at the job's
first call of ``torch.compile`` (wrapped for that until :func:`remove`; ``nn.Module.compile`` calls it too), before
anything compiled has been traced.

Sealing also silences one warning: an ``OptimizedModule`` (``torch.compile(model)``) called while a global module
hook is registered warns that the hook fires "an extra time". The step boundary's forward pre-hook is registered
from the end of an optimizer step to the next forward, so it is there at every such call; it removes itself when it
first fires, at the outer module, and never fires twice. docs/capture.md says so.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
import weakref
from typing import Any, Callable

log = logging.getLogger(__name__)

__all__ = ["install", "remove", "opaque", "seal", "sealed"]


#: The warning torch.compile(model) gives at each call site while any global module hook is registered.
GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"

_trampolines: weakref.WeakSet = weakref.WeakSet()  # every opaque() made and still referenced
_sealed = False
_compile_orig: Callable[..., Any] | None = None  # torch.compile as it was before install() wrapped it


def opaque(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` as a trampoline that torch.compile never traces into (module docstring); register this instead."""
    slot = [hook]  # `hook` itself until sealed, then `hook` wrapped by torch.compiler.disable

    def trampoline(*args: Any, **kwargs: Any) -> Any:
        return slot[0](*args, **kwargs)

    def seal_one() -> None:
        import torch

        slot[0] = torch.compiler.disable(hook)

    trampoline.__distprof_seal__ = seal_one  # type: ignore[attr-defined]
    trampoline.__name__ = getattr(hook, "__name__", "hook")
    trampoline.__qualname__ = getattr(hook, "__qualname__", trampoline.__name__)
    if _sealed:
        _seal_each([trampoline])
    _trampolines.add(trampoline)
    return trampoline


def seal() -> None:
    """From now on every trampoline (made and to come) calls its hook through torch.compiler.disable. Never
    raises: a hook that cannot be wrapped stays as it was (one warning)."""
    global _sealed
    if _sealed:
        return
    _sealed = True
    warnings.filterwarnings("ignore", message=GLOBAL_HOOK_WARNING, category=UserWarning)
    _seal_each(list(_trampolines))


def _seal_each(trampolines: list[Callable[..., Any]]) -> None:
    try:
        for t in trampolines:
            t.__distprof_seal__()
    except Exception as e:  # noqa: BLE001 -- the job goes on; torch.compile may then trace distprof's hooks
        log.warning("distprof: could not keep torch.compile out of distprof's hooks (%s: %s)", type(e).__name__, e)


def sealed() -> bool:
    return _sealed


def install() -> None:
    """Seal now if torch._dynamo is loaded, else at the job's first torch.compile call."""
    global _compile_orig
    import torch

    if _sealed or _compile_orig is not None:
        return
    if "torch._dynamo" in sys.modules:
        seal()
        return
    orig = torch.compile

    @functools.wraps(orig)
    def compile(*args: Any, **kwargs: Any) -> Any:
        seal()
        return orig(*args, **kwargs)

    compile.__distprof_compile__ = orig  # type: ignore[attr-defined]
    torch.compile = compile
    _compile_orig = orig


def remove() -> None:
    """Put torch.compile back (unless something wrapped it again since). Sealed trampolines stay sealed."""
    global _compile_orig
    import torch

    if _compile_orig is None:
        return
    if getattr(torch.compile, "__distprof_compile__", None) is _compile_orig:
        torch.compile = _compile_orig
    _compile_orig = None
