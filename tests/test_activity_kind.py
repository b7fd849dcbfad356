"""The activity kind of a Kineto event on a torch without `_KinetoEvent.activity_type()` (torch 2.11 and older).

On this torch the real activity types are there, so every event of a real profile checks the fallback; the CUDA
kinds, which a CPU machine cannot record, are a table (tests/gpu/check_gpu.py checks them against a CUDA trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch._C._autograd import DeviceType

from distprof.capture.extract import _activity_kind
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
]


@pytest.mark.parametrize("ev,kind", TABLE, ids=[e.label[:24] for e, _ in TABLE])
def test_the_kind_of_an_event_from_its_device_flag_and_name(ev, kind):
    assert kind in schema.KIND_CODE
    assert _activity_kind(ev, DeviceType.CPU) == kind


def test_the_fallback_agrees_with_torch_on_a_real_cpu_profile():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True) as prof:
        for _ in range(2):
            with torch.profiler.record_function("my_region"):
                model(torch.randn(8, 16)).sum().backward()
            prof.step()
    events = list(prof.profiler.kineto_results.events())
    if not hasattr(events[0], "activity_type"):
        pytest.skip("this torch has no activity_type() to compare with")
    kinds = {e.activity_type() for e in events}
    assert {"cpu_op", "user_annotation", "cpu_instant_event"} <= kinds
    wrong = [(e.name(), e.activity_type(), _activity_kind(e, DeviceType.CPU)) for e in events
             if _activity_kind(e, DeviceType.CPU) != e.activity_type()]
    assert not wrong, wrong[:5]
