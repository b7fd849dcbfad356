"""A step ended by the window's close ends where its iteration did (build_tables' step_end_ns), not at the close."""

from __future__ import annotations

import numpy as np

from distprof.events.tables import Columns, Strings, build_tables
from distprof.storage import schema

MAIN = 7


def window(step_spans, ops):
    """ProfilerStep#k spans [(k, start, end)] and cpu ops [(ts, dur)] on the main thread."""
    strings = Strings()
    ann, op = schema.KIND_CODE["user_annotation"], schema.KIND_CODE["cpu_op"]
    name = [strings.id(f"ProfilerStep#{k}") for k, _, _ in step_spans] + [strings.id("aten::mm")] * len(ops)
    ts = [a for _, a, _ in step_spans] + [t for t, _ in ops]
    dur = [b - a for _, a, b in step_spans] + [d for _, d in ops]
    n = len(ts)
    kind = np.array([ann] * len(step_spans) + [op] * len(ops), np.uint8)
    cols = Columns(name_id=np.array(name, np.uint32), kind=kind,
                   tid=np.full(n, MAIN, np.int64), device=np.full(n, -1, np.int16), ts=np.array(ts, np.int64),
                   dur=np.array(dur, np.int64), flops=np.zeros(n, np.int64), corr=np.zeros(n, np.int64))
    return cols, strings


def steps_and_op_steps(cols, strings, **kw):
    b = build_tables(cols, strings, main_tid=MAIN, **kw)
    ev = b.tables["events"]
    names = np.array(strings.list())[ev["name_id"]]
    st = b.tables["steps"]
    return ([(int(k), int(a), int(e)) for k, a, e in zip(st["step"], st["start_ns"], st["end_ns"])],
            ev["step"][names == "aten::mm"].tolist(), st["n_events"].tolist())


def test_last_step_clipped_to_its_iteration_end():
    # steps 5, 6 back to back; step 6's span runs on to the close at 1000 (a checkpoint at 300..900 after its
    # iteration ended at 250)
    cols, strings = window([(5, 0, 100), (6, 100, 1000)], [(10, 50), (120, 100), (300, 600)])
    steps, op_steps, _ = steps_and_op_steps(cols, strings)
    assert steps == [(5, 0, 100), (6, 100, 1000)] and op_steps == [5, 6, 6]
    steps, op_steps, n_events = steps_and_op_steps(cols, strings, step_end_ns={6: 250})
    assert steps == [(5, 0, 100), (6, 100, 250)]
    assert op_steps == [5, 6, -1]  # the checkpoint's op belongs to no step
    assert n_events == [2, 2]  # step 6: its ProfilerStep annotation and one op


def test_end_never_lengthens_a_step_and_a_tail_is_no_step():
    cols, strings = window([(5, 0, 100), (6, 100, 400)], [(10, 50), (150, 100)])
    steps, _, _ = steps_and_op_steps(cols, strings, step_end_ns={5: 5000})
    assert steps == [(5, 0, 100), (6, 100, 400)]  # only ever shortens
    # step 6 began after the last iteration (its "end" precedes its start): a tail, left out
    steps, op_steps, _ = steps_and_op_steps(cols, strings, step_end_ns={6: 99})
    assert steps == [(5, 0, 100)] and op_steps == [5, -1]
