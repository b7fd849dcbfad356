"""Speed and peak memory of `distprof import` on a large Kineto trace, against json.load and orjson in the same run.

    python benchmarks/import_speed.py [--mb 200] [--gz] [--repeat 2] [--keep DIR]
    python benchmarks/import_speed.py --vs-hta [--ranks 8] [--events 216000] [--rounds 3] [--keep DIR]

Builds a trace of about --mb MB of JSON in a temp dir by replicating the events of a real A100 Kineto trace
(tests/data/hta/nccl_parser_config/nccl_data.json.gz: 40k events, 9.8 MB) back to back: each copy's timestamps are
shifted past the previous copy (text-exact, the microsecond decimals are kept as written), its flow/correlation/
External ids offset so they stay unique, and its ProfilerStep#N renumbered; the metadata events, the profiler span
and the window markers appear once, stretched over all copies. Kineto's own layout (one key group per line) is kept.

Then, each in a fresh subprocess so peak RSS (wait4's ru_maxrss of that child, read by a bare launcher process) is
per measurement:
  (a) stdlib json.load of the file, (b) orjson.loads of the file's bytes, (c) `python -m distprof import FILE -o DIR`.
Wall times are whole processes (interpreter start included, ~0.05 s). --gz also writes the trace gzipped and repeats
the three on it.

--vs-hta measures the issue's goal (import + report >= 5x faster than HTA loading and analysing the same traces):
--ranks re-ranked copies of a real V100 trace (tests/data/hta/ns_resolution_trace, 68.7k events, replicated to about
--events each as above, gzipped), then per round, in fresh processes: HTA 0.5.0 (the venv of tests/hta_env.py)
loading them and computing the temporal breakdown and the communication/computation overlap; `distprof import` and
`distprof report --json`; the same two under `mpiexec -n 2`. Prints each one's median wall and CPU time (the CPU
figure is the steadier one on a loaded machine), the load average per round, and the ratios.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = ROOT / "tests" / "data" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"

_EVENT_RE = re.compile(rb"\n  \{.*?\n  \}", re.S)  # one top-level event (Kineto indents them by 2, nested by 4+)
_SUB_RE = re.compile(rb'"(ts|id|External id|correlation)": (-?\d+)|"ProfilerStep#(\d+)"')
_DUR_RE = re.compile(rb'"dur": (\d+)')
_TS_RE = re.compile(rb'"ts": (\d+)')


@dataclass(frozen=True)
class Replica:
    """A real trace's events replicated back to back: ``head`` (up to ``"traceEvents": [``), ``body`` (the copies,
    then the metadata events, the profiler span and the window markers, stretched over all copies) and ``tail``."""

    head: bytes
    body: bytes
    tail: bytes
    n_events: int
    copies: int


def replicate(source: Path, *, target_bytes: int | None = None, copies: int | None = None) -> Replica:
    """`copies` copies of `source`'s events (or as many as make about `target_bytes` of JSON)."""
    raw = gzip.decompress(source.read_bytes())
    doc = orjson.loads(raw)
    events = doc["traceEvents"]
    open_m = re.search(rb'"traceEvents"\s*:\s*\[', raw)
    close = raw.rfind(b"\n  ]")
    assert open_m is not None and close > open_m.end(), "unexpected layout of the source trace"
    head, body, tail = raw[: open_m.end()], raw[open_m.end(): close], raw[close:]
    chunks = [m.group(0) for m in _EVENT_RE.finditer(body)]
    assert len(chunks) == len(events), f"split {len(chunks)} events, the JSON has {len(events)}"

    # Kineto writes the metadata events, the profiler span and the window markers after the activity events
    n_reg = next(i for i, e in enumerate(events) if e.get("ph") in ("M", "i") or e.get("cat") == "Trace")
    assert all(e.get("ph") in ("M", "i") or e.get("cat") == "Trace" for e in events[n_reg:])
    regular, special = chunks[:n_reg], chunks[n_reg:]
    reg_ev = events[:n_reg]
    t_lo = min(e["ts"] for e in reg_ev)
    t_hi = max(e["ts"] + e.get("dur", 0) for e in reg_ev)
    span_us = math.ceil(t_hi - t_lo) + 1000  # next copy starts 1 ms after this one ends
    ids = [e.get("id", 0) for e in reg_ev if isinstance(e.get("id"), int)]
    ids += [e.get("args", {}).get(k, 0) for e in reg_ev for k in ("External id", "correlation")]
    id_stride = 10 ** len(str(max(ids)))
    steps = sorted({int(e["name"].split("#")[1]) for e in reg_ev if str(e.get("name", "")).startswith("ProfilerStep#")})
    step_stride = steps[-1] - steps[0] + 1 if steps else 0

    reg_body = b",".join(regular)
    if copies is None:
        fixed = len(head) + len(tail) + sum(len(c) + 1 for c in special)
        copies = max(1, round(((target_bytes or 0) - fixed) / (len(reg_body) + 1)))

    def shifted(k: int) -> bytes:
        dt, did, dstep = k * span_us, k * id_stride, k * step_stride

        def sub(m: re.Match) -> bytes:
            if m.group(3) is not None:
                return b'"ProfilerStep#%d"' % (int(m.group(3)) + dstep)
            key, v = m.group(1), int(m.group(2))
            return b'"%s": %d' % (key, v + (dt if key == b"ts" else did))

        return reg_body if k == 0 else _SUB_RE.sub(sub, reg_body)

    def special_chunk(c: bytes) -> bytes:
        if b'"cat": "Trace"' in c:  # the profiler span covers every copy
            return _DUR_RE.sub(lambda m: b'"dur": %d' % (int(m.group(1)) + (copies - 1) * span_us), c, count=1)
        if b'"Record Window End"' in c:  # the window ends after the last copy
            return _TS_RE.sub(lambda m: b'"ts": %d' % (int(m.group(1)) + (copies - 1) * span_us), c, count=1)
        return c

    out = b",".join(shifted(k) for k in range(copies)) + b"".join(b"," + special_chunk(c) for c in special)
    return Replica(head=head, body=out, tail=tail, n_events=copies * len(regular) + len(special), copies=copies)


_DIST_RE = re.compile(rb'"distributedInfo": (\{[^\n]*\}),\n')


def reranked_head(head: bytes, rank: int, world_size: int) -> bytes:
    """`head` with distributedInfo saying rank `rank` of `world_size` (its default group: every rank), written with
    Kineto's ``": "`` separators (HTA finds a file's rank with the pattern ``"rank":\\s+(\\d+)``)."""
    m = _DIST_RE.search(head)
    assert m is not None, "the source trace has no one-line distributedInfo"
    di = orjson.loads(m.group(1))
    di.update(rank=rank, world_size=world_size)
    for g in di.get("pg_config") or []:
        g.update(pg_size=world_size, ranks=list(range(world_size)))
    return head[: m.start(1)] + json.dumps(di).encode() + head[m.end(1):]


def build_trace(dest: Path, target_bytes: int) -> tuple[int, int]:
    """Write the replicated trace to ``dest``; returns (events, copies)."""
    rep = replicate(SOURCE, target_bytes=target_bytes)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(rep.head + rep.body + rep.tail)
    os.replace(tmp, dest)
    return rep.n_events, rep.copies


def build_ranks(dest: Path, source: Path, events: int, ranks: int, *, gz: bool) -> tuple[list[Path], Replica]:
    """`ranks` traces ``rank-<r>.json[.gz]`` in `dest`: each about `events` events (whole copies of `source`'s),
    the same events on every rank, distributedInfo re-ranked. Gzipped, the events are compressed once and shared: a
    file is three gzip members (head, events, tail), which gzip readers (Python's, HTA's) read as one stream."""
    n_src = sum(1 for _ in _EVENT_RE.finditer(gzip.decompress(source.read_bytes())))
    rep = replicate(source, copies=max(1, round(events / n_src)))
    dest.mkdir(parents=True, exist_ok=True)
    body = gzip.compress(rep.body, compresslevel=6, mtime=0) if gz else rep.body
    tail = gzip.compress(rep.tail, mtime=0) if gz else rep.tail
    out = []
    for r in range(ranks):
        head = reranked_head(rep.head, r, ranks)
        p = dest / f"rank-{r}.json{'.gz' if gz else ''}"
        with open(p.with_name(p.name + ".tmp"), "wb") as fh:
            fh.write(gzip.compress(head, mtime=0) if gz else head)
            fh.write(body)
            fh.write(tail)
        os.replace(p.with_name(p.name + ".tmp"), p)
        out.append(p)
    return out, rep


_JSON_CHILD = """
import gzip, json, sys, time
p = sys.argv[1]
t = time.perf_counter()
with (gzip.open(p, 'rb') if p.endswith('.gz') else open(p, 'rb')) as f:
    d = json.load(f)
print(len(d['traceEvents']), time.perf_counter() - t)
"""
_ORJSON_CHILD = """
import gzip, orjson, sys, time
p = sys.argv[1]
t = time.perf_counter()
with (gzip.open(p, 'rb') if p.endswith('.gz') else open(p, 'rb')) as f:
    d = orjson.loads(f.read())
print(len(d['traceEvents']), time.perf_counter() - t)
"""


# Peak RSS of a child is read by a small launcher process, not by this one: Linux counts the memory high-water
# mark of the spawning process's address space into the child's ru_maxrss (vfork/fork + exec), and this process
# has held the whole source trace. The launcher is a bare interpreter (~10 MB), below any child measured.
_LAUNCHER = """
import os, subprocess, sys, time
with open(sys.argv[1], 'wb') as out:
    t0 = time.perf_counter()
    p = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
print(os.waitstatus_to_exitcode(status), wall, ru.ru_maxrss * 1024, ru.ru_utime + ru.ru_stime)
"""


def measure(cmd: list[str], log: Path, *, env: dict | None = None) -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS bytes, stdout, CPU seconds) of one fresh child process. CPU seconds are the child's
    and those of its descendants it waited for (MPI processes, HTA's worker pool); peak RSS is the largest one's."""
    if env is None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _LAUNCHER, str(log), *cmd], env=env, cwd=str(log.parent),
                       capture_output=True, text=True)
    text = log.read_text(errors="replace") if log.exists() else ""
    if p.returncode != 0:
        raise SystemExit(f"launcher failed ({p.returncode}):\n{p.stderr[-2000:]}")
    rc, wall, rss, cpu = p.stdout.split()
    if int(rc) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({rc}):\n{text[-2000:]}")
    return float(wall), int(rss), text, float(cpu)


def run_set(path: Path, n_events: int, json_bytes: int, tmp: Path, repeat: int) -> None:
    label = f"{path.name} ({path.stat().st_size / 1e6:.0f} MB on disk, {json_bytes / 1e6:.0f} MB JSON, "
    print(label + f"{n_events:,} events)")
    py = sys.executable
    rows: dict[str, tuple[float, int]] = {}
    notes: dict[str, str] = {}
    parse: dict[str, float] = {}
    for name, cmd_of in (
        ("json.load", lambda i: [py, "-c", _JSON_CHILD, str(path)]),
        ("orjson.loads", lambda i: [py, "-c", _ORJSON_CHILD, str(path)]),
        ("distprof import", lambda i: [py, "-m", "distprof", "import", str(path), "-o", str(tmp / f"run{i}"),
                                       "--no-progress"]),
    ):
        best_t, best_rss = math.inf, 0
        for i in range(repeat):
            shutil.rmtree(tmp / f"run{i}", ignore_errors=True)
            wall, rss, out, _ = measure(cmd_of(i), tmp / "child.log")
            best_t, best_rss = min(best_t, wall), max(best_rss, rss)
            if name == "distprof import":
                m = re.search(r"([\d,]+) events", out)
                shard = sum(f.stat().st_size for f in (tmp / f"run{i}").rglob("*") if f.is_file())
                notes[name] = (f"  (it read {m.group(1) if m else '?'} events; shard {shard / 1e6:.1f} MB, small "
                               "because the copies repeat)")
            else:
                got, parse_s = out.split()[-2:]
                parse[name] = min(parse.get(name, math.inf), float(parse_s))
                notes[name] = f"  (read and parse {parse[name]:.2f} s, the rest is start and exit)" + (
                    "" if int(got) == n_events else f"  READ {int(got):,} EVENTS")
        rows[name] = best_t, best_rss
        print(f"  {name:16s} {best_t:7.2f} s  {n_events / best_t:>11,.0f} events/s  peak RSS {best_rss / 1e6:7.0f} MB"
              + notes[name])
    wall, rss, _, _ = measure([py, "-c", "import distprof.importers.run, distprof.storage"], tmp / "child.log")
    print(f"  (start + imports of distprof import alone: {wall:.2f} s, peak RSS {rss / 1e6:.0f} MB)")
    dt, dr = rows["distprof import"]
    jt, jr = rows["json.load"]
    ot, orr = rows["orjson.loads"]
    print(f"  distprof import time = {dt / jt:.2f}x json.load, {dt / ot:.2f}x orjson.loads")
    print(f"  distprof import peak RSS = {dr / json_bytes:.2f}x the JSON's size, {dr / jr:.3f}x json.load's "
          f"({jr / json_bytes:.1f}x the JSON), {dr / orr:.3f}x orjson's ({orr / json_bytes:.1f}x the JSON)")



V100 = ROOT / "tests" / "data" / "hta" / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"

# HTA 0.5.0 as the baseline times it: load the run directory (its default: a fork pool of min(ranks, cpus)
# workers), then the temporal breakdown and the communication/computation overlap
_HTA_CHILD = """
import logging, sys, time
logging.disable(logging.WARNING)
import warnings; warnings.simplefilter('ignore')
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
t3 = time.perf_counter()
print(len(ta.t.traces), len(tb), len(ov), t1 - t0, t2 - t1, t3 - t2)
"""


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def vs_hta(tmp: Path, *, ranks: int, events: int, rounds: int) -> None:
    """The issue's goal: distprof import + report (serial, and mpiexec -n 2) against HTA 0.5.0 loading and analysing
    the same `ranks` re-ranked copies of a real V100 trace; every measurement `rounds` times, interleaved, medians."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hta_env import ensure_venv  # the venv the parity tests use (built once, reused)

    hta_py, built = ensure_venv()
    if built:
        print(f"built the HTA venv in {built:.0f} s")
    t0 = time.perf_counter()
    files, rep = build_ranks(tmp / "traces", V100, events, ranks, gz=True)
    disk = sum(f.stat().st_size for f in files)
    json_mb = (len(rep.head) + len(rep.body) + len(rep.tail)) / 1e6
    print(f"built {ranks} traces of {rep.n_events:,} events ({rep.copies} copies of {V100.name}, {json_mb:.1f} MB "
          f"JSON, {disk / ranks / 1e6:.1f} MB gzipped each) in {time.perf_counter() - t0:.1f} s")
    mpi = shutil.which("mpiexec")
    py = sys.executable
    hta_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    runs = {"serial": tmp / "run-serial", "mpi": tmp / "run-mpi"}
    steps: dict[str, list] = {}

    def dp(args: list, n: int | None) -> list[str]:
        cmd = [py, "-m", "distprof", *map(str, args), "--no-progress"]
        return [mpi, "-n", str(n), *cmd] if n else cmd

    plan: list[tuple[str, object]] = [("HTA load + analyses", lambda: ([str(hta_py), "-c", _HTA_CHILD,
                                                                         str(tmp / "traces")], hta_env))]
    for tag, n in (("serial", None), ("mpi", 2 if mpi else None)):
        if tag == "mpi" and not mpi:
            print("  (no mpiexec on PATH: pip install mpi4py mpich for the mpiexec -n 2 figures)")
            continue
        label = "" if tag == "serial" else " (mpiexec -n 2)"
        plan.append((f"distprof import{label}", lambda r=runs[tag], n=n: (
            dp(["import", tmp / "traces", "-o", r, "--force", "--run-id", "bench"], n), None)))
        plan.append((f"distprof report{label}", lambda r=runs[tag], n=n, t=tag: (
            dp(["report", r, "--json", tmp / f"report-{t}.json"], n), None)))
    for k in range(rounds):
        print(f"  round {k + 1}/{rounds}: load average {_load()}", flush=True)
        for name, make in plan:
            cmd, env = make()
            wall, rss, out, cpu = measure(cmd, tmp / "child.log", env=env)
            steps.setdefault(name, []).append((wall, cpu, rss))
            if name.startswith("HTA") and k == 0:
                got = out.split()[-6:]
                print(f"    HTA loaded {got[0]} ranks (import {float(got[3]):.1f} s, load {float(got[4]):.1f} s, "
                      f"analyses {float(got[5]):.1f} s in the first round)")
    print(f"  load average at the end {_load()} ({os.cpu_count()} cores)")
    med = {name: (_median([w for w, _, _ in v]), _median([c for _, c, _ in v]), max(r for _, _, r in v))
           for name, v in steps.items()}
    for name, (w, c, r) in med.items():
        walls = ", ".join(f"{w:.1f}" for w, _, _ in steps[name])
        print(f"  {name:34s} median {w:6.2f} s wall, {c:6.2f} s CPU, peak RSS {r / 1e6:5.0f} MB   (walls: {walls})")
    hw, hc, _ = med["HTA load + analyses"]
    for label in ("", " (mpiexec -n 2)"):
        if f"distprof import{label}" not in med:
            continue
        iw, ic, _ = med[f"distprof import{label}"]
        rw, rc, _ = med[f"distprof report{label}"]
        print(f"  HTA / distprof import + report{label or ' (serial)'}: {hw / (iw + rw):.2f}x wall "
              f"({hw:.1f} s vs {iw + rw:.1f} s), {hc / (ic + rc):.2f}x CPU ({hc:.1f} s vs {ic + rc:.1f} s); goal >= 5x")
    a, b = tmp / "report-serial.json", tmp / "report-mpi.json"
    if a.exists() and b.exists():
        same = _without_timing(json.loads(a.read_text())) == _without_timing(json.loads(b.read_text()))
        print(f"  report.json of the serial and the mpiexec import + report: {'the same' if same else 'DIFFERENT'}")


def _without_timing(doc):
    if isinstance(doc, dict):
        return {k: _without_timing(v) for k, v in doc.items() if "timing" not in k and k != "seconds"}
    if isinstance(doc, list):
        return [_without_timing(v) for v in doc]
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200, help="size of the trace JSON to build, MB (default 200)")
    ap.add_argument("--gz", action="store_true", help="also measure the same trace gzipped")
    ap.add_argument("--repeat", type=int, default=2, help="runs per measurement; best time, highest RSS (default 2)")
    ap.add_argument("--keep", metavar="DIR", help="build the trace in DIR and leave it there")
    ap.add_argument("--vs-hta", action="store_true",
                    help="instead: distprof import + report (serial and mpiexec -n 2) against HTA 0.5.0 on --ranks "
                         "re-ranked copies of a real V100 trace")
    ap.add_argument("--ranks", type=int, default=8, help="--vs-hta: traces (default 8)")
    ap.add_argument("--events", type=int, default=216_000, help="--vs-hta: events per trace, about (default 216k)")
    ap.add_argument("--rounds", type=int, default=3, help="--vs-hta: rounds; medians are printed (default 3)")
    args = ap.parse_args()
    if args.mb <= 0 or args.repeat < 1 or args.rounds < 1 or args.ranks < 1 or args.events < 1:
        ap.error("--mb must be > 0, --repeat, --rounds, --ranks and --events >= 1")

    with tempfile.TemporaryDirectory(prefix="dp-import-bench-") as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        if args.vs_hta:
            vs_hta(tmp, ranks=args.ranks, events=args.events, rounds=args.rounds)
            return
        trace = tmp / "rank-0.json"
        t0 = time.perf_counter()
        n_events, copies = build_trace(trace, int(args.mb * 1e6))
        size = trace.stat().st_size
        print(f"built {trace} from {copies} copies of {SOURCE.name}: {size / 1e6:.0f} MB, {n_events:,} events "
              f"in {time.perf_counter() - t0:.1f} s")
        run_set(trace, n_events, size, tmp, args.repeat)
        if args.gz:
            gz = tmp / "rank-0.json.gz"
            t0 = time.perf_counter()
            with open(trace, "rb") as src, gzip.open(gz.with_name(gz.name + ".tmp"), "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(gz.with_name(gz.name + ".tmp"), gz)
            print(f"gzipped in {time.perf_counter() - t0:.1f} s")
            run_set(gz, n_events, size, tmp, args.repeat)


if __name__ == "__main__":
    main()
