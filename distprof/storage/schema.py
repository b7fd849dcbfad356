"""The shard schema: names, dtypes and codes shared by the writer and every reader.

Documented for users in docs/shard-format.md; change both together. A reader accepts any
shard whose major version it knows and refuses a newer major with a clear message.
"""

from __future__ import annotations

import numpy as np

FORMAT_NAME = "distprof-shard"
SCHEMA_VERSION = "2.1"  # 1.1: optional cuda_memory tables (--memory-history), threads.device, device_properties;
# 1.2: comms.peer, comms.p2p_seq; 1.3: steps.cpu_run_ns, cpu_wait_ns, cpu_wait_opt_ns; 1.4: optional cpu/samples;
# 1.5: steps.page_faults; 2.0: each table is one compound dataset (a field per column), not a group of column
# datasets -- HDF5 spends ~340 bytes of metadata on every dataset, 54 of them per shard (readers still read 1.x);
# 2.1: a process group's ranks as "ranks_range": [start, stop, step] where they form one (storage.group_ranks)
SCHEMA_MAJOR = 2

#: One file per rank per finished window; a crash loses at most the window in flight.
SHARD_TEMPLATE = "rank{rank:05d}.w{window:04d}.h5"
SHARD_GLOB = "rank*.w*.h5"
#: Written by each rank when it closes: windows written, errors recorded.
STATUS_TEMPLATE = "rank{rank:05d}.status.json"
TMP_SUFFIX = ".tmp"

CHUNK_ROWS = 65536

# Activity kinds, as Kineto names them.
KINDS = (
    "other",
    "cpu_op",
    "user_annotation",
    "python_function",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "cpu_instant_event",
    "gpu_user_annotation",
    "overhead",
    "cuda_sync",
    "privateuse1_runtime",
    "privateuse1_driver",
)
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

# What an event is for the analyses.
CATEGORIES = ("other", "compute", "communication", "memcpy")
CAT_OTHER, CAT_COMPUTE, CAT_COMM, CAT_MEMCPY = range(4)

# Role of a communication event (the /comms table).
COMM_ROLES = ("none", "exec", "enqueue", "annotation")
ROLE_EXEC, ROLE_ENQUEUE, ROLE_ANNOTATION = 1, 2, 3

# Thread roles (the /threads table).
THREAD_ROLES = ("other", "main", "comm_worker", "device_stream")
THREAD_OTHER, THREAD_MAIN, THREAD_COMM, THREAD_STREAM = range(4)

# Clock-sync phases.
PHASES = ("window_start", "window_end")

#: Value a reader gives a column that an older shard lacks. Every column added in a minor version needs an entry
#: here (0 when nothing better): storage.validate rejects a shard that lacks any other column of a table it has.
MISSING_DEFAULTS: dict[tuple[str, str], int] = {("threads", "device"): -1, ("comms", "peer"): -1,
                                                ("comms", "p2p_seq"): -1, ("steps", "cpu_run_ns"): -1,
                                                ("steps", "cpu_wait_ns"): -1, ("steps", "cpu_wait_opt_ns"): -1,
                                                ("steps", "page_faults"): -1}

#: table -> column -> dtype. Every column of a table has the same length. Since 2.0 a table is one dataset at
#: ``/<table>`` whose compound type has a field per column; in 1.x it was a group holding a dataset per column.
TABLES: dict[str, dict[str, np.dtype]] = {
    "events": {
        "name_id": np.dtype("u4"),
        "kind": np.dtype("u1"),
        "category": np.dtype("u1"),
        "tid": np.dtype("i8"),
        "device": np.dtype("i2"),
        "ts_ns": np.dtype("i8"),
        "dur_ns": np.dtype("i8"),
        "step": np.dtype("i4"),
        "flops": np.dtype("i8"),
        "corr_id": np.dtype("i8"),
    },
    "comms": {
        "row": np.dtype("i8"),
        "op_id": np.dtype("u4"),
        "role": np.dtype("u1"),
        "pg": np.dtype("i4"),
        "seq": np.dtype("i4"),
        "bytes": np.dtype("i8"),
        "group_size": np.dtype("i4"),
        "nccl_seq": np.dtype("i8"),
        "peer": np.dtype("i4"),  # 1.2: point-to-point partner's global rank, -1 unknown / not p2p (1.1 reads -1)
        "p2p_seq": np.dtype("i8"),  # 1.2: number of the transfer per (group, peer, direction), -1 unknown
    },
    "threads": {
        "tid": np.dtype("i8"),
        "device": np.dtype("i2"),  # -1 OS thread, else the stream's device (1.1; a 1.0 shard reads it as -1)
        "name_id": np.dtype("u4"),
        "role": np.dtype("u1"),
        "pg": np.dtype("i4"),
    },
    "memory": {
        "ts_ns": np.dtype("i8"),
        "bytes": np.dtype("i8"),
        "total_bytes": np.dtype("i8"),
        "device": np.dtype("i2"),
        "step": np.dtype("i4"),
    },
    "steps": {
        "step": np.dtype("i4"),
        "start_ns": np.dtype("i8"),
        "end_ns": np.dtype("i8"),
        "flops": np.dtype("i8"),
        "peak_mem_bytes": np.dtype("i8"),
        "n_events": np.dtype("i8"),
        "cpu_run_ns": np.dtype("i8"),  # 1.3: the stepping thread's time on a CPU in the step, -1 unknown
        "cpu_wait_ns": np.dtype("i8"),  # 1.3: its time runnable but waiting for a CPU (capture/schedstat.py), -1
        "cpu_wait_opt_ns": np.dtype("i8"),  # 1.3: that wait from the previous step's optimizer start to this one's
        "page_faults": np.dtype("i8"),  # 1.5: the stepping thread's page faults (minor + major) in the step, -1
    },
    "clock/samples": {
        "phase": np.dtype("u1"),
        "peer": np.dtype("i4"),
        "t_send_ns": np.dtype("i8"),
        "t_remote_ns": np.dtype("i8"),
        "t_recv_ns": np.dtype("i8"),
    },
    # 1.1, optional (only with --memory-history on CUDA): per step and device, from the allocator's history.
    "cuda_memory": {
        "step": np.dtype("i4"),
        "device": np.dtype("i2"),
        "complete": np.dtype("u1"),
        "n_alloc": np.dtype("i8"),
        "alloc_bytes": np.dtype("i8"),
        "n_free": np.dtype("i8"),
        "free_bytes": np.dtype("i8"),
        "n_segment_alloc": np.dtype("i8"),
        "segment_alloc_bytes": np.dtype("i8"),
        "n_segment_free": np.dtype("i8"),
        "segment_free_bytes": np.dtype("i8"),
        "n_oom": np.dtype("i4"),
        "alloc_peak_bytes": np.dtype("i8"),
        "alloc_end_bytes": np.dtype("i8"),
        "reserved_peak_bytes": np.dtype("i8"),
        "reserved_end_bytes": np.dtype("i8"),
        "peak_ns": np.dtype("i8"),
    },
    # 1.1, optional: the largest allocations of each step and device.
    "cuda_memory_blocks": {
        "step": np.dtype("i4"),
        "device": np.dtype("i2"),
        "ts_ns": np.dtype("i8"),
        "bytes": np.dtype("i8"),
        "stream": np.dtype("i8"),
        "lifetime_ns": np.dtype("i8"),
        "live_at_peak": np.dtype("u1"),
        "frame_id": np.dtype("u4"),
        "user_frame_id": np.dtype("u4"),
    },
    # 1.4, optional (--cpu-sample-ms > 0, Linux): the training thread's scheduler statistics, sampled while recording
    "cpu/samples": {
        "t_ns": np.dtype("i8"),  # time.time_ns() of the sample (the events' clock)
        "run_ns": np.dtype("i8"),  # the thread's time on a CPU so far
        "wait_ns": np.dtype("i8"),  # its time runnable but waiting for a CPU so far
    },
    "clock/local": {
        "phase": np.dtype("u1"),
        "time_ns": np.dtype("i8"),
        "monotonic_ns": np.dtype("i8"),
        "perf_counter_ns": np.dtype("i8"),
    },
}

#: 2.x: every root attribute but `format` and `schema_version` lives in this one HDF5 attribute, a JSON object
#: holding each as its 1.x attribute held it (JSON_ATTRS as JSON text): h5py spends ~35 µs on each attribute it
#: reads, 40 of them per shard, the largest part of scanning a run's shards.
ATTRS_JSON = "attributes"
#: Root attributes every shard carries (JSON-encoded where marked).
REQUIRED_ATTRS = (
    "format",
    "schema_version",
    "run_id",
    "rank",
    "world_size",
    "local_rank",
    "host",
    "device",
    "backend",
    "torch_version",
    "distprof_version",
    "window",
    "first_step",
    "last_step",
)
JSON_ATTRS = ("config", "process_groups", "errors", "sim_clock", "timings", "steps_covered", "memory_history",
              "device_properties", "trigger")
#: Tables a shard may lack (a reader returns them empty): added in a minor version or written only on request.
OPTIONAL_TABLES = ("cuda_memory", "cuda_memory_blocks", "cpu/samples")


def empty_table(name: str, n: int = 0) -> dict[str, np.ndarray]:
    """Columns of table `name` with `n` zeroed rows."""
    return {col: np.zeros(n, dtype=dt) for col, dt in TABLES[name].items()}
