"""Advance the profiler once per training iteration without touching the user's code.

The global optimizer-step post hook marks an iteration as done. It fires *inside* the `Optimizer.step#…` event, so
calling `prof.step()` there would cut that event in two; instead the step is deferred to the next natural boundary:
the next module forward outside any optimizer step (a global forward pre-hook registered only while a step is
pending), else the next step of the primary optimizer, else close. Handled:

* closure-based optimizers (``optimizer.step(closure)``: LBFGS, Lightning's automatic optimization), whose forward
  and backward run inside the step: a forward inside an open optimizer step never ends the step; the optimizer's
  ``step`` is wrapped (on the instance, once, outermost) so that the deferred boundary falls just *before* its
  ``Optimizer.step#…`` event begins — as soon as a closure is seen, or a pending step had to be advanced at an
  optimizer step's start (no module forward in between, which would cut that event);

* several optimizers: one iteration = one step of the *primary* optimizer (the first one seen completing an
  outermost step);
* wrappers such as ZeroRedundancyOptimizer whose step runs the inner optimizer's step (the hook fires twice): only
  outermost steps count;
* GradScaler steps skipped because of inf/NaN gradients (the optimizer hook does not fire): still one iteration;
* ``Join`` (uneven inputs): the optimizer steps ZeroRedundancyOptimizer's join hook runs after the rank ran out of
  inputs are no iterations (``join.py``).

At the first few primary optimizer steps the callers are looked at for a framework distprof knows
(``frameworks.py``: DeepSpeed's ZeRO engine, its stage and data-parallel group).

`last_end_ns` is when the latest iteration finished (``time.time_ns()`` as the primary optimizer's step returned): a
step still pending when the job closes ends there, not at the close (what follows the loop is no step's work). The
`on_iteration_end` callback runs at that moment too (the profiler samples the thread's CPU time there, for the same
reason).
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import types
import weakref
from typing import Callable

from . import frameworks, join
from .compiled import opaque

log = logging.getLogger(__name__)

#: Primary optimizer steps at whose start the callers are looked at for a framework, until one is found.
FRAMEWORK_PROBES = 3


class OptimizerStepper:
    def __init__(self, on_iteration: Callable[[], None], on_optimizer_start: Callable[[], None] | None = None,
                 on_iteration_end: Callable[[], None] | None = None) -> None:
        self._on_iteration = on_iteration
        self._on_optimizer_start = on_optimizer_start  # the primary optimizer's outermost step begins
        self._on_iteration_end = on_iteration_end  # an iteration just finished (before its deferred step runs)
        self._primary: weakref.ref | None = None
        self._depth = 0
        self._pending = False
        self._handles: list = []
        self._fwd_handle = None
        # as torch calls them: never traced by torch.compile (capture/compiled.py)
        self._forward_hook = opaque(self._forward_pre)
        self._fire_before_step = opaque(self._fire_pending)  # a compiled opt.step traces the step wrapper
        self._scaler_orig = None
        self._wrapped: list[tuple[weakref.ref, object, object]] = []  # (optimizer, our step, the step it wraps)
        self.iterations = 0  # completed iterations seen (including GradScaler-skipped ones)
        self.skipped = 0  # GradScaler-skipped iterations
        self.last_end_ns = 0  # time.time_ns() when the latest iteration finished (0: none yet)
        self._probes_left = FRAMEWORK_PROBES

    # -- install / remove ---------------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_optimizer_step_pre_hook(opaque(self._pre)),
                         register_optimizer_step_post_hook(opaque(self._post))]
        self._patch_grad_scaler()
        join.install()

    def remove(self) -> None:
        if self._handles:
            join.remove()
        for h in self._handles:
            h.remove()
        self._handles = []
        self._drop_forward_hook()
        self._unwrap_steps()
        if self._scaler_orig is not None:
            from torch.amp.grad_scaler import GradScaler

            GradScaler.step = self._scaler_orig
            self._scaler_orig = None

    def _patch_grad_scaler(self) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:
            return
        orig = GradScaler.step
        stepper = self

        @functools.wraps(orig)
        def step(scaler, optimizer, *args, **kwargs):
            before, depth = stepper.iterations, stepper._depth
            out = orig(scaler, optimizer, *args, **kwargs)
            if stepper.iterations == before and stepper._depth == depth and stepper._is_primary(optimizer):
                stepper.skipped += 1
                stepper._iteration_done()
            return out

        GradScaler.step = step
        self._scaler_orig = orig

    # -- hooks --------------------------------------------------------------------------------------------------
    def _is_primary(self, opt) -> bool:
        return self._primary is None or self._primary() is opt

    def _pre(self, opt, args, kwargs) -> None:
        if join.shadowing():  # the rank ran out of inputs: Join's rounds are no iterations (capture/join.py)
            return
        self._depth += 1
        if self._depth == 1 and _closure_of(args, kwargs) is not None:
            self._wrap_step(opt)  # forward and backward run inside this step: its next call is the boundary
        if self._pending and self._depth == 1 and self._is_primary(opt):
            # no module forward since the last iteration: advance here rather than merge two iterations (this
            # once inside the Optimizer.step#… event; from now on before it)
            self.fire()
            self._wrap_step(opt)
        if self._depth == 1 and self._on_optimizer_start is not None and self._is_primary(opt):
            self._on_optimizer_start()
        if self._depth == 1 and self._probes_left and self._is_primary(opt):
            self._probes_left = 0 if frameworks.probe(sys._getframe(1)) else self._probes_left - 1

    def _post(self, opt, args, kwargs) -> None:
        if join.shadowing():
            return
        self._depth = max(0, self._depth - 1)
        if self._depth > 0:
            return  # an inner optimizer of a wrapper (ZeroRedundancyOptimizer)
        if self._primary is None or self._primary() is None:
            self._primary = weakref.ref(opt)
        if self._primary() is not opt:
            return
        self._iteration_done()

    def _iteration_done(self) -> None:
        t = time.time_ns()
        self.iterations += 1
        if self._pending:  # two iterations without a forward or optimizer pre-hook in between
            self.fire()
        self.last_end_ns = t
        if self._on_iteration_end is not None:
            self._on_iteration_end()
        self._pending = True
        if self._fwd_handle is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._fwd_handle = register_module_forward_pre_hook(self._forward_hook)

    def _forward_pre(self, module, args) -> None:
        if self._pending and self._depth == 0:  # a forward inside an open optimizer step (a closure) is no boundary
            self.fire()

    def _drop_forward_hook(self) -> None:
        if self._fwd_handle is not None:
            self._fwd_handle.remove()
            self._fwd_handle = None

    # -- the boundary before a closure-based optimizer's step ---------------------------------------------------
    def _wrap_step(self, opt) -> None:
        """Wrap `opt.step` (what a call runs now: an LR scheduler's wrapper, else the class's) on the instance, so
        that a pending step fires before its ``Optimizer.step#…`` event begins, outside every optimizer step."""
        if any(ref() is opt for ref, _, _ in self._wrapped):
            return
        inner = opt.__dict__.get("step")  # an instance-level wrapper, called as it is; None: the class's step
        stepper = self

        fire_first = self._fire_before_step

        def step(this, *args, **kwargs):
            fire_first()
            return (inner if inner is not None else type(this).step.__get__(this))(*args, **kwargs)

        # its attributes (LR schedulers' _wrapped_by_lr_sched, torch's `hooked`) stay visible; a bound method, so
        # that an LR scheduler created later can wrap it in turn (it reads step.__func__)
        functools.update_wrapper(step, inner if inner is not None else type(opt).step)
        bound = types.MethodType(step, opt)
        try:
            opt.step = bound
        except (AttributeError, TypeError) as e:  # an optimizer whose attributes cannot be set: boundary as before
            log.debug("distprof: %s.step not wrapped: %s", type(opt).__name__, e)
            return
        self._wrapped.append((weakref.ref(opt), bound, inner))

    def _fire_pending(self) -> None:
        """Before a wrapped optimizer step: the pending step fires, outside every optimizer step."""
        if self._handles and self._pending and self._depth == 0:
            self.fire()

    def _unwrap_steps(self) -> None:
        """Put back each wrapped step still ours; one wrapped again since (by an LR scheduler) stays, inert."""
        for ref, bound, inner in self._wrapped:
            opt = ref()
            if opt is None or opt.__dict__.get("step") is not bound:
                continue
            if inner is None:
                del opt.step
            else:
                opt.step = inner
        self._wrapped = []

    def fire(self) -> None:
        """Run the deferred step now (no-op when none is pending)."""
        if not self._pending:
            return
        self._pending = False
        self._drop_forward_hook()
        self._on_iteration()

    @property
    def pending(self) -> bool:
        return self._pending


def _closure_of(args: tuple, kwargs: dict):
    """The closure an optimizer step was given (``step(closure)`` or ``step(closure=…)``), else None; `args`
    begins with the optimizer, as torch's step hooks receive them."""
    c = kwargs.get("closure") if kwargs else None
    if c is None and len(args) > 1:
        c = args[1]
    return c if callable(c) else None
