"""Kineto events of older torch: no `_KinetoEvent.activity_type()` (torch <= 2.11), no `is_user_annotation()` and
no nanosecond times (torch 2.3).

On this torch the real activity types are there, so every event of a real profile checks the fallback, and the same
profile read through a stand-in that offers only what torch 2.3 offers must give the same tables; the CUDA kinds,
which a CPU machine cannot record, are a table (tests/gpu/check_gpu.py checks them against a CUDA trace). The whole
capture was run on torch 2.3.1, 2.11.0 and 2.14.1 with `tests/gpu/check_gpu.py --allow-cpu` (2026-12-06).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch._C._autograd import DeviceType

from distprof.capture.extract import _activity_kind, _read_events
from distprof.storage import schema


@dataclass
class Ev:
    """The three things the fallback may read of a `_KinetoEvent`."""

    label: str
    device: DeviceType = DeviceType.CPU
    annotation: bool = False

    def name(self):
        return self.label

    def device_type(self):
        return self.device

    def is_user_annotation(self):
        return self.annotation


class Torch23Ev:
    """A real event as torch 2.3 shows it: a scope instead of the user-annotation flag, microsecond times."""

    def __init__(self, e):
        self._e = e

    def __getattr__(self, attr):
        if attr in ("activity_type", "is_user_annotation", "start_ns", "duration_ns", "end_ns", "metadata_json"):
            raise AttributeError(attr)
        return getattr(self._e, attr)

    def scope(self):
        return 7 if self._e.is_user_annotation() else 0

    def start_us(self):
        return self._e.start_ns() // 1000

    def duration_us(self):
        return self._e.duration_ns() // 1000


CUDA = DeviceType.CUDA
TABLE = [
    (Ev("aten::mm"), "cpu_op"),
    (Ev("ProfilerStep#3", annotation=True), "user_annotation"),
    (Ev("[memory]"), "cpu_instant_event"),
    (Ev("[OutOfMemory]"), "cpu_instant_event"),
    (Ev("cudaLaunchKernel"), "cuda_runtime"),
    (Ev("cudaMemcpyAsync"), "cuda_runtime"),
    (Ev("cudaStreamSynchronize"), "cuda_runtime"),
    (Ev("cuLaunchKernelEx"), "cuda_driver"),
    (Ev("cudnn_convolution"), "cpu_op"),  # a lower-case letter after "cuda"/"cu": not an API call
    (Ev("custom_op"), "cpu_op"),
    (Ev("ampere_sgemm_128x64_nn", CUDA), "kernel"),
    (Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", CUDA), "kernel"),
    (Ev("Memcpy HtoD (Pageable -> Device)", CUDA), "gpu_memcpy"),
    (Ev("Memset (Device)", CUDA), "gpu_memset"),
    (Ev("forward", CUDA, annotation=True), "gpu_user_annotation"),
    (Ev("Stream Sync", CUDA), "cuda_sync"),
    (Ev("Activity Buffer Request"), "overhead"),
    (Ev("train.py(41): main"), "python_function"),
    (Ev("<built-in method item of Tensor object at 0x7f>"), "python_function"),
    (Ev("nn.Module: Linear_0"), "python_function"),
    (Ev("aten::linear(12)"), "cpu_op"),  # not "file(line): fn"
]


class ScopeEv(Ev):
    """torch 2.3: no is_user_annotation(); record_function regions have RecordScope.USER_SCOPE (7)."""

    is_user_annotation = None

    def scope(self):
        return 7 if self.annotation else 0


TABLE += [(ScopeEv(e.label, e.device, e.annotation), kind) for e, kind in TABLE]


@pytest.mark.parametrize("ev,kind", TABLE, ids=[f"{type(e).__name__}-{e.label[:24]}" for e, _ in TABLE])
def test_the_kind_of_an_event_from_its_device_flag_and_name(ev, kind):
    assert kind in schema.KIND_CODE
    assert _activity_kind(ev, DeviceType.CPU) == kind


def _profile():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True) as prof:
        for _ in range(2):
            with torch.profiler.record_function("my_region"):
                model(torch.randn(8, 16)).sum().backward()
            prof.step()
    return list(prof.profiler.kineto_results.events())


def test_the_fallback_agrees_with_torch_on_a_real_cpu_profile():
    events = _profile()
    if not hasattr(events[0], "activity_type"):
        pytest.skip("this torch has no activity_type() to compare with")
    kinds = {e.activity_type() for e in events}
    assert {"cpu_op", "user_annotation", "cpu_instant_event"} <= kinds
    wrong = [(e.name(), e.activity_type(), _activity_kind(e, DeviceType.CPU)) for e in events
             if _activity_kind(e, DeviceType.CPU) != e.activity_type()]
    assert not wrong, wrong[:5]


def test_a_torch_2_3_profile_gives_the_same_columns_to_the_microsecond():
    events = _profile()
    if not hasattr(events[0], "activity_type"):
        pytest.skip("this torch is an old one itself")
    new, old = _read_events(events), _read_events([Torch23Ev(e) for e in events])
    assert old.strings.list() == new.strings.list()
    for col in ("name_id", "kind", "tid", "device", "flops", "corr", "msg_bytes"):
        assert (getattr(old.cols, col) == getattr(new.cols, col)).all(), col
    assert (abs(old.cols.ts - new.cols.ts) < 1000).all() and (abs(old.cols.dur - new.cols.dur) < 1000).all()
    assert (old.is_mem == new.is_mem).all() and (old.nbytes == new.nbytes).all() and old.is_mem.any()
    kinds = {schema.KINDS[k] for k in old.cols.kind.tolist()}
    assert {"cpu_op", "user_annotation"} <= kinds


class UndecodableEv:
    """An event whose name() raises as torch 2.13's did for a Python-tracer frame (byte 0x8f), in a --stack profile."""

    def __init__(self, e):
        self._e = e

    def __getattr__(self, attr):
        return getattr(self._e, attr)

    def name(self):
        raise UnicodeDecodeError("utf-8", b"\x8f", 0, 1, "invalid start byte")


def test_an_event_whose_name_torch_cannot_decode_is_kept_under_a_placeholder():
    """Before, the UnicodeDecodeError lost the whole window (one warning); now only that event's name is lost."""
    from distprof.capture.extract import UNDECODABLE_NAME

    events = _profile()
    bad = len(events) // 2
    raw = _read_events([UndecodableEv(e) if i == bad else e for i, e in enumerate(events)])
    good = _read_events(events)
    names = raw.strings.list()
    assert names[raw.cols.name_id[bad]] == UNDECODABLE_NAME
    keep = np.arange(len(events)) != bad
    assert [names[j] for j in raw.cols.name_id[keep]] == [good.strings.list()[j] for j in good.cols.name_id[keep]]
    assert (raw.cols.ts == good.cols.ts).all() and (raw.cols.kind == good.cols.kind).all()
