"""Kineto traces -> a distprof run directory (one shard per trace file = per rank, window 0).

    import_traces(["traces/"], "runs/imported")   # then: distprof report runs/imported

Files: ``*.json``/``*.json.gz`` given directly, or found in directories (TensorBoard ``*.pt.trace.json(.gz)``,
HTA-style ``rank-N.json.gz``, ``sampled_rank-N.json.gz``). Rank and world size come from the trace's
``distributedInfo``, else a rank number in the file name (``rank-3``, ``rank_3``, ``rank3``), else ``rank=`` (one
file), else rank 0 of 1 (one file, said in a note; several files that name no rank are refused). Each file becomes
one window: a trace is one profiling window, whatever ProfilerSteps it holds. A trace without ``ProfilerStep#N`` gets
steps made from its top-level user regions, its graph replays or the whole trace (:mod:`.units`; shard attribute
``step_unit``), said in a note.

Clocks: imported traces carry no clock-sync samples. Each rank is recorded as its own host (``imported-rank<N>``)
unless ``one_host`` says they share a machine (one clock, no alignment); ``distprof report`` then aligns hosts from
synchronising collectives (or leaves them unaligned, with a warning).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import _version
from ..errors import ConfigError, DistprofError
from ..events.tables import build_tables
from ..parallel import deal
from ..progress import progress_enabled
from ..storage import schema
from ..analysis.rank.stored import summarize_image
from ..storage.summary_group import StoredSummary
from ..storage.writer import write_shard
from ..storage.validate import MAX_WORLD_SIZE
from .kineto import KinetoTrace, read_header, read_kineto, shown
from .units import PROFILER_STEP, StepUnits, step_units

log = logging.getLogger(__name__)

__all__ = ["import_traces", "find_trace_files", "ImportResult", "deal"]

_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class ImportResult:
    run_dir: Path
    shards: list[Path]
    ranks: list[int]
    world_size: int
    n_events: int
    raw_bytes: int
    seconds: float
    warnings: list[str]


def find_trace_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Trace files named or found (recursively) under the given paths, sorted, without duplicates."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_TRACE_SUFFIXES))
            if not found:
                raise ConfigError(f"{p}: no *.json or *.json.gz trace files in this directory")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise ConfigError(f"{p}: not a regular file or a directory; pass trace files (.json, .json.gz)")
        else:
            raise ConfigError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    return [f for f in out if not (f.resolve() in seen or seen.add(f.resolve()))]


def _info_int(path: Path, di: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    """distributedInfo[key] as an int in lo..hi, None when absent; a ConfigError naming the file and field else."""
    v = di.get(key)
    if v is None:
        return None
    if v.__class__ is not int or not lo <= v <= hi:
        raise ConfigError(f"{path}: distributedInfo.{key} is {shown(v)}, not a number {lo}..{hi}; fix the "
                          f"trace" + (" or pass --rank N (one file)" if key == "rank" else " or pass --world-size N"))
    return v


def _distributed_info(header: dict[str, Any]) -> dict[str, Any]:
    di = header.get("distributedInfo")
    return di if isinstance(di, dict) else {}


def _rank_of(path: Path, header: dict[str, Any], explicit: int | None, n_files: int) -> int | None:
    """The file's rank: distributedInfo, else the file name, else `explicit` (one file); None for one file that names
    none (it is rank 0, with a note); a ConfigError for one of several files that names none."""
    di = _distributed_info(header)
    r = _info_int(path, di, "rank", 0, MAX_WORLD_SIZE - 1)
    if r is not None:
        ws = _info_int(path, di, "world_size", 1, MAX_WORLD_SIZE)
        if ws is not None and r >= ws:
            raise ConfigError(f"{path}: distributedInfo.rank {r} is not below its world_size {ws}; fix the trace")
        return r
    m = None
    for m in _RANK_RE.finditer(path.name):
        pass
    if m is not None:
        r = int(m.group(1))
        if r >= MAX_WORLD_SIZE:
            raise ConfigError(f"{path}: rank {r} in the file name is beyond {MAX_WORLD_SIZE - 1}; rename the file")
        return r
    if n_files == 1:
        return explicit
    raise ConfigError(f"{path}: no rank in the trace (distributedInfo) nor in the file name; rename it "
                      f"rank-N.json.gz (each of the {n_files} files needs its rank; --rank N is for one file)")


def _process_groups(di: dict[str, Any], world_size: int, warnings: list[str], path: Path) -> list[dict[str, Any]]:
    """distributedInfo.pg_config as process groups; ranks that are not ranks of the job are dropped (warned)."""
    cfg = di.get("pg_config")
    out: list[dict[str, Any]] = []
    if not isinstance(cfg, list):
        if cfg is not None:
            warnings.append(f"{path}: distributedInfo.pg_config is not a list; ignored")
        return out
    for g in cfg:
        if not isinstance(g, dict):
            continue
        ranks = g.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = [int(x) for x in ranks.strip("[]").split(",") if x.strip()]
            except ValueError:
                ranks = None
        if ranks is not None and not (isinstance(ranks, list) and all(
                r.__class__ is int and 0 <= r < world_size for r in ranks)):
            warnings.append(f"{path}: distributedInfo.pg_config entry {len(out)}: 'ranks' is not a list of ranks "
                            f"0..{world_size - 1}; its ranks are left unknown")
            ranks = None
        out.append({"index": len(out), "name": str(g.get("pg_name", len(out))), "desc": str(g.get("pg_desc", "")),
                    "backend": str(g.get("backend_config", di.get("backend", ""))), "ranks": list(ranks or [])})
    return out


def _ranks_in_job(pgs: list[dict[str, Any]], world_size: int, warnings: list[str], path: Path) -> None:
    """Process groups named by events (Process Group Ranks) may list ranks beyond the job: those lists are dropped."""
    for g in pgs:
        ranks = g.get("ranks") or []
        if any(not 0 <= int(r) < world_size for r in ranks):
            warnings.append(f"{path}: process group {g.get('name')!r} lists ranks beyond the world size "
                            f"{world_size}; its ranks are left unknown")
            g["ranks"] = []


def _device_name(meta: dict[str, Any], devices: np.ndarray) -> tuple[str, str]:
    """The name of the first device the events use: its ``deviceProperties`` entry, else the only entry when the
    trace lists one device (a process that sees one device numbers it 0, Kineto by its physical index), else
    ``gpu N``."""
    props = meta.get("deviceProperties") or []
    used = np.unique(devices[devices >= 0])
    if used.size == 0:
        return "cpu", "cpu"
    idx = int(used[0])
    named = [p for p in (props if isinstance(props, list) else []) if isinstance(p, dict) and p.get("name")]
    for p in named:
        if p.get("id") == idx:
            return str(p["name"]), "cuda"
    if len(named) == 1 and used.size == 1:
        return str(named[0]["name"]), "cuda"
    return f"gpu {idx}", "cuda"


def _device_properties(meta: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The trace's ``deviceProperties`` (one dict per device Kineto saw), kept as written; None when absent.
    Entries that are not objects with an integer ``id`` (or none) are left out."""
    props = meta.get("deviceProperties")
    if not isinstance(props, list):
        return None
    return [dict(p) for p in props if isinstance(p, dict) and (p.get("id") is None or p["id"].__class__ is int)]


def _made_steps(tr: KinetoTrace, warnings: list[str]) -> tuple[StepUnits | None, int | None]:
    """The steps made for a trace without ProfilerStep# (None when it has them; its note added to `warnings`) and
    the stepping thread: the thread of the regions or replays made into steps, else the reader's."""
    units = step_units(tr.columns, tr.strings, has_profiler_steps=tr.has_profiler_steps, main_tid=tr.main_tid,
                       path=tr.path)
    if units is None:
        return None, tr.main_tid
    warnings.append(units.note)
    return units, units.tid if units.tid is not None else tr.main_tid


def _shard_for(tr: KinetoTrace, rank: int, world_size: int, run_id: str, ref_rank: int, one_host: bool,
               out: Path, codec: str, warnings: list[str]) -> Path:
    di = tr.distributed_info
    pgs = _process_groups(di, world_size, warnings, tr.path)
    t0 = time.perf_counter()
    units, main_tid = _made_steps(tr, warnings)
    built = build_tables(tr.columns, tr.strings, main_tid=main_tid, thread_names=tr.thread_names,
                         stream_names=tr.stream_names, process_groups=pgs, add_process_groups=True,
                         step_spans=None if units is None else units.spans)
    _ranks_in_job(built.process_groups, world_size, warnings, tr.path)
    tabs = built.tables
    tabs["memory"] = schema.empty_table("memory")
    steps = tabs["steps"]
    ev = tabs["events"]
    device, device_type = _device_name(tr.meta, ev["device"])
    if len(steps["step"]):
        w0, w1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    elif len(ev["ts_ns"]):
        w0, w1 = int(ev["ts_ns"].min()), int((ev["ts_ns"] + ev["dur_ns"]).max())
    else:
        w0 = w1 = 0
    host = "imported" if one_host else f"imported-rank{rank}"
    attrs = {
        "run_id": run_id,
        "rank": rank,
        "world_size": world_size,
        "local_rank": rank,
        "local_world_size": 1,
        "host": host,
        "real_host": "",
        "pid": int(main_tid or 0),
        "device": device,
        "device_type": device_type,
        "backend": str(di.get("backend", "none")),
        "torch_version": "",
        "distprof_version": _version.__version__,
        "python_version": platform.python_version(),
        "process_groups": built.process_groups,
        "config": {"source": "kineto", "file": str(tr.path), "schemaVersion": tr.meta.get("schemaVersion"),
                   "nccl_version": di.get("nccl_version")},
        "window": 0,
        "first_step": int(steps["step"].min()) if len(steps["step"]) else -1,
        "last_step": int(steps["step"].max()) if len(steps["step"]) else -1,
        "steps_covered": [int(s) for s in steps["step"]],
        "step_unit": PROFILER_STEP if units is None else units.unit,
        "complete": True,
        "window_start_ns": w0,
        "window_end_ns": w1,
        "timings": {"extract_s": round(time.perf_counter() - t0, 6), "n_events": int(len(ev["ts_ns"]))},
        "errors": [],
        "clock_role": "reference" if rank == ref_rank else ("member" if one_host else "leader"),
        "clock_leader": ref_rank if one_host else rank,
        "clock_reference": ref_rank,
        "clock_source": "imported",
        "sim_clock": None,
    }
    props = _device_properties(tr.meta)
    if props is not None:
        attrs["device_properties"] = props
    path = out / schema.SHARD_TEMPLATE.format(rank=rank, window=0)
    write_shard(path, tabs, tr.strings.list(), attrs, codec=codec, summarize=_summary)
    return path


def _summary(image: bytes, path: Path) -> StoredSummary | None:
    """The per-rank summary stored with an imported shard (as capture stores it); None, with a warning, when it
    cannot be computed: the shard is written without it and the report summarises its events."""
    try:
        return summarize_image(image, path)
    except Exception as e:  # noqa: BLE001 -- the shard itself is still good
        log.warning("distprof import: %s: its per-rank summary was not stored (%s: %s); the report will summarise "
                    "its events instead", path.name, type(e).__name__, e)
        return None


@dataclass(frozen=True)
class _Failure:
    """An error met while importing, and the index of the file it is about (None: not about one file).

    On the process that met it, :meth:`error` is the exception itself (a serial import raises it unchanged). Sent to
    MPI rank 0, only its class and message travel (an exception object need not pickle): rank 0 raises the same
    class with the same message, once. `message` names the MPI process for errors that are not distprof's own.
    """

    kind: type
    message: str
    index: int | None = None
    exc: BaseException | None = field(default=None, compare=False)

    @classmethod
    def of(cls, e: BaseException, index: int | None = None, where: str = "") -> _Failure:
        if isinstance(e, DistprofError):
            return cls(type(e), str(e), index, e)
        return cls(DistprofError, f"{where}{type(e).__name__}: {e}", index, e)

    def __getstate__(self) -> dict:
        return {"kind": self.kind, "message": self.message, "index": self.index}

    def __setstate__(self, state: dict) -> None:
        for k, v in {**state, "exc": None}.items():
            object.__setattr__(self, k, v)

    def error(self) -> BaseException:
        if self.exc is not None:
            return self.exc
        try:
            return self.kind(self.message)
        except Exception:  # noqa: BLE001 -- a class that takes other arguments: the message still gets through
            return DistprofError(self.message)


@dataclass(frozen=True)
class _HeaderRank:
    """What one file's header says: its rank and distributedInfo.world_size (None: absent), or why it cannot be used."""

    index: int
    rank: int | None = None
    world_size: int | None = None
    failure: _Failure | None = None
    assumed: bool = False  # the only file, naming no rank: rank 0


@dataclass(frozen=True)
class _Plan:
    """Everything decided once for the whole import (MPI rank 0 decides and sends it to the others)."""

    files: list[Path]
    ranks: list[int]  # per file
    costs: list[int]  # per file: its size on disk
    world_size: int
    ref_rank: int
    run_id: str
    tmp: Path
    created: bool  # run_dir did not exist before this import
    notes: tuple[str, ...] = ()  # about the run as planned (a rank assumed), said with the import's warnings


@dataclass(frozen=True)
class _FileDone:
    """One trace imported: its shard (under the plan's tmp directory) and what the summary needs of it."""

    index: int
    shard: Path
    n_events: int
    raw_bytes: int
    warnings: list[str]


def _prepare(paths: Sequence[str | os.PathLike], run_dir: Path, world_size: int | None, rank: int | None,
             force: bool) -> list[Path]:
    """The trace files, after checking the flags and the output directory (shards already there removed with
    `force`)."""
    files = find_trace_files(paths)
    if not files:
        raise ConfigError("no trace files given")
    if world_size is not None and not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError(f"--world-size {world_size}: must be 1..{MAX_WORLD_SIZE}")
    if rank is not None and not 0 <= rank < MAX_WORLD_SIZE:
        raise ConfigError(f"--rank {rank}: must be 0..{MAX_WORLD_SIZE - 1}")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"-o {run_dir}: exists and is not a directory; name a new directory for the run")
    if run_dir.exists() and any(run_dir.glob(schema.SHARD_GLOB)):
        if not force:
            raise ConfigError(f"{run_dir}: already holds shards; choose a new directory or pass --force to replace them")
        for p in run_dir.glob(schema.SHARD_GLOB):
            p.unlink()
    return files


def _header_ranks(files: list[Path], indices: Iterable[int], rank: int | None, where: str = "") -> list[_HeaderRank]:
    """Rank and world size of each file named by `indices`, from its header only (no events read)."""
    out = []
    for i in indices:
        f = files[i]
        try:
            hdr = read_header(f)
            r = _rank_of(f, hdr, rank, len(files))
            out.append(_HeaderRank(i, 0 if r is None else r,
                                   _info_int(f, _distributed_info(hdr), "world_size", 1, MAX_WORLD_SIZE),
                                   assumed=r is None))
        except Exception as e:  # noqa: BLE001 -- raised by _plan in file order (a process must not stop alone)
            out.append(_HeaderRank(i, failure=_Failure.of(e, i, where)))
    return out


def _plan(files: list[Path], heads: list[_HeaderRank], run_dir: Path, *, world_size: int | None,
          run_id: str | None) -> _Plan:
    """Ranks, world size, reference rank and run id of the import, checked in file order as a serial import reads
    the headers (a duplicate rank is reported before any heavy work); then the temporary directory for the shards."""
    ranks: dict[int, Path] = {}
    sizes: dict[Path, int] = {}
    for h in sorted(heads, key=lambda h: h.index):
        if h.failure is not None:
            raise h.failure.error()
        f = files[h.index]
        if h.rank in ranks:
            raise ConfigError(f"{f}: claims rank {h.rank} like {ranks[h.rank]}; import one trace per rank (put other "
                              "profiling cycles into another run directory)")
        ranks[h.rank] = f
        if h.world_size is not None:
            sizes[f] = h.world_size
    if world_size is None and len(set(sizes.values())) > 1:
        first = next(iter(sizes))
        other = next(f for f, n in sizes.items() if n != sizes[first])
        raise ConfigError(f"{other}: distributedInfo.world_size {sizes[other]} differs from {sizes[first]} in "
                          f"{first.name}; import one job's traces together (or pass --world-size N)")
    ws = world_size if world_size is not None else (max(sizes.values()) if sizes else max(ranks) + 1)
    if ws <= max(ranks):
        raise ConfigError(f"world size {ws} but rank {max(ranks)} present ({ranks[max(ranks)]}); "
                          "pass --world-size larger than every rank")
    file_ranks = [h.rank for h in sorted(heads, key=lambda h: h.index)]
    costs = [_size_on_disk(f) for f in files]
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".import-", dir=run_dir))
    except OSError as e:
        raise ConfigError(f"-o {run_dir}: cannot write there ({e.strerror or e}); pick a writable directory") \
            from None
    notes = tuple(f"{files[h.index]}: no rank in the trace (distributedInfo) nor in the file name: imported as "
                  f"rank 0 of {ws} (pass --rank N to choose another)" for h in heads if h.assumed)
    return _Plan(files=files, ranks=file_ranks, costs=costs, world_size=ws, ref_rank=min(ranks),
                 run_id=run_id or run_dir.resolve().name, tmp=tmp, created=created, notes=notes)


def _size_on_disk(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0  # read_kineto names the problem


def _import_file(plan: _Plan, i: int, *, one_host: bool, codec: str) -> _FileDone:
    """Parse trace `i` of the plan and write its shard into the plan's temporary directory."""
    f, r = plan.files[i], plan.ranks[i]
    warnings: list[str] = []
    tr = read_kineto(f)
    if tr.n_inexact:
        warnings.append(f"{f}: {tr.n_inexact} timestamp(s) not exact to the ns (exponent notation beyond "
                        "2^43 µs: may be off by < 1 µs)")
    bad = {k: v for k, v in tr.skipped.items() if k != "Trace"}  # the profiler's own span and markers
    if bad:
        warnings.append(f"{f}: skipped {sum(bad.values()):,} malformed event(s) ("
                        + ", ".join(f"{v:,} {k}" for k, v in sorted(bad.items())) + ")")
    if tr.ignored:
        warnings.append(f"{f}: ignored {sum(tr.ignored.values()):,} out-of-range value(s) (left unknown: "
                        + ", ".join(f"{v:,} {k}" for k, v in sorted(tr.ignored.items())) + ")")
    shard = _shard_for(tr, r, plan.world_size, plan.run_id, plan.ref_rank, one_host, plan.tmp, codec, warnings)
    return _FileDone(index=i, shard=shard, n_events=tr.n_events_raw, raw_bytes=tr.raw_bytes, warnings=warnings)


def _import_share(plan: _Plan, share: list[int], *, one_host: bool, codec: str, show: bool,
                  where: str | None = None) -> tuple[list[_FileDone], _Failure | None]:
    """Import the files of `share` in index order. With `where` (an MPI process), the first file that fails stops
    the share and is returned, with the ones done; without, its error propagates."""
    done: list[_FileDone] = []
    it: Iterable[int] = share
    if show:
        from tqdm import tqdm

        it = tqdm(share, desc="importing traces", unit="file", file=sys.stderr, leave=False)
    for i in it:
        if where is None:
            done.append(_import_file(plan, i, one_host=one_host, codec=codec))
            continue
        try:
            done.append(_import_file(plan, i, one_host=one_host, codec=codec))
        except Exception as e:  # noqa: BLE001 -- reported once, by MPI rank 0, as the serial import would
            return done, _Failure.of(e, i, where)
    return done, None


def _commit(plan: _Plan, run_dir: Path, done: list[_FileDone]) -> list[Path]:
    """Move every shard from the temporary directory to its final name (in file order)."""
    final = []
    for d in sorted(done, key=lambda d: d.index):
        dest = run_dir / d.shard.name
        os.replace(d.shard, dest)
        final.append(dest)
    return final


def _abort(plan: _Plan, run_dir: Path) -> None:
    shutil.rmtree(plan.tmp, ignore_errors=True)
    if plan.created:  # leave nothing behind that looks like a run
        shutil.rmtree(run_dir, ignore_errors=True)


def _result(plan: _Plan, run_dir: Path, done: list[_FileDone], final: list[Path], *, one_host: bool,
            seconds: float) -> ImportResult:
    """The summary of a finished import: warnings in file order, then the run's own; each logged once."""
    done = sorted(done, key=lambda d: d.index)
    warnings = list(plan.notes) + [w for d in done for w in d.warnings]
    n_ranks = len(plan.ranks)
    if n_ranks > 1 and not one_host:
        warnings.append("imported traces carry no clock-sync samples: `distprof report` aligns ranks from "
                        "synchronising collectives where it can (pass --one-host if all ranks ran on one machine)")
    missing = plan.world_size - n_ranks
    if missing:
        warnings.append(f"{n_ranks} of {plan.world_size} ranks imported; the others are reported missing")
    for w in warnings:
        log.warning("%s", w)
    return ImportResult(run_dir=run_dir, shards=final, ranks=sorted(plan.ranks), world_size=plan.world_size,
                        n_events=sum(d.n_events for d in done), raw_bytes=sum(d.raw_bytes for d in done),
                        seconds=seconds, warnings=warnings)


def import_traces(
    paths: Sequence[str | os.PathLike],
    run_dir: str | os.PathLike,
    *,
    run_id: str | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    one_host: bool = False,
    force: bool = False,
    codec: str = "zstd",
    progress: bool | None = None,
    comm: Any = None,
) -> ImportResult | None:
    """Import Kineto traces into `run_dir` (created). All shards appear together or not at all.

    With `comm` (an mpi4py communicator of more than one process, as ``mpiexec -n P distprof import`` passes), the
    files are split over its processes (see :func:`_import_mpi`); only its rank 0 gets the ImportResult (the others
    get None). The shards and the result are those of a serial import, timings aside.
    """
    run_dir = Path(run_dir)
    if comm is not None and comm.Get_size() > 1:
        return _import_mpi(comm, paths, run_dir, run_id=run_id, world_size=world_size, rank=rank,
                           one_host=one_host, force=force, codec=codec, progress=progress)
    files = _prepare(paths, run_dir, world_size, rank, force)
    plan = _plan(files, _header_ranks(files, range(len(files)), rank), run_dir, world_size=world_size,
                 run_id=run_id)
    t0 = time.perf_counter()
    return _finish(plan, run_dir, lambda: _import_share(plan, list(range(len(files))), one_host=one_host, codec=codec,
                                                        show=progress_enabled(progress, len(files), 2))[0],
                   one_host=one_host, t0=t0)


def _finish(plan: _Plan, run_dir: Path, work: Callable[[], list[_FileDone]], *, one_host: bool,
            t0: float) -> ImportResult:
    """The shards `work` wrote moved to their final names and the result; on any failure (raised) nothing is left
    behind, and the temporary directory goes in any case."""
    try:
        done = work()
        final = _commit(plan, run_dir, done)
    except BaseException:
        _abort(plan, run_dir)
        raise
    finally:
        shutil.rmtree(plan.tmp, ignore_errors=True)
    return _result(plan, run_dir, done, final, one_host=one_host, seconds=time.perf_counter() - t0)


def _on_root(comm: Any, where: str, step: Callable[[], Any]) -> tuple[bool, Any]:
    """`step` run on MPI rank 0 and its result broadcast: (True, result) everywhere, or when it failed, rank 0 raises
    the failure and the others get (False, None) (they stop quietly)."""
    value: Any = None
    failure: _Failure | None = None
    if comm.Get_rank() == 0:
        try:
            value = step()
        except Exception as e:  # noqa: BLE001 -- every process must hear about it
            failure = _Failure.of(e, where=where)
    if comm.bcast(failure is not None, root=0):  # rank 0 alone raises it; the others stop quietly
        if comm.Get_rank() == 0:
            raise failure.error()
        return False, None
    return True, comm.bcast(value, root=0)


def _import_mpi(comm, paths, run_dir: Path, *, run_id, world_size, rank, one_host, force, codec,
                progress) -> ImportResult | None:
    """The import split over MPI processes; every decision about the whole run is taken once, on MPI rank 0.

    1. Rank 0 checks the flags and the output directory and lists the files; 2. every process reads the headers of
    every P-th file, rank 0 gathers them and plans the import (ranks, world size, reference rank, run id, the
    temporary directory, in file order as the serial import: the same first error); 3. the files are dealt out by
    size (largest first, each to the least-loaded process) and each process writes its files' shards into the
    temporary directory (a shared file system, as for the run directory itself), stopping at its first bad file;
    4. rank 0 gathers what was done: on any failure it removes the temporary directory and raises the failure of the
    lowest file (the one a serial import stops at), else it moves every shard to its final name and returns the
    result. Output (progress, warnings, the result) on rank 0 only; nobody waits forever for a process that failed.
    """
    me, size = comm.Get_rank(), comm.Get_size()
    where = f"MPI process {me}: "
    ok, files = _on_root(comm, where, lambda: _prepare(paths, run_dir, world_size, rank, force))
    if not ok:
        return None
    heads = comm.gather(_header_ranks(files, range(me, len(files), size), rank, where), root=0)
    ok, plan = _on_root(comm, where, lambda: _plan(files, [h for part in heads for h in part], run_dir,
                                                   world_size=world_size, run_id=run_id))
    if not ok:
        return None
    t0 = time.perf_counter()
    share = deal(plan.costs, size)[me]
    show = me == 0 and progress_enabled(progress, len(share), 2)
    try:
        part = _import_share(plan, share, one_host=one_host, codec=codec, show=show, where=where)
    except BaseException:
        shutil.rmtree(plan.tmp, ignore_errors=True)  # interrupted: the others' shards go too (no partial run)
        raise
    parts = comm.gather(part, root=0)
    if me != 0:
        return None
    return _finish(plan, run_dir, lambda: _gathered(parts), one_host=one_host, t0=t0)


def _gathered(parts: list[tuple[list[_FileDone], _Failure | None]]) -> list[_FileDone]:
    """The files every MPI process imported; on any failure, that of the lowest file (where a serial import stops)."""
    failures = [f for _, f in parts if f is not None]
    if failures:
        raise min(failures, key=lambda f: f.index).error()
    return [d for ds, _ in parts for d in ds]
