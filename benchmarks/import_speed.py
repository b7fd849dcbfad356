"""Speed and peak memory of `distprof import` on a large Kineto trace, against json.load and orjson in the same run.

    python benchmarks/import_speed.py [--mb 200] [--gz] [--repeat 2] [--keep DIR]

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
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = ROOT / "tests" / "data" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"

_EVENT_RE = re.compile(rb"\n  \{.*?\n  \}", re.S)  # one top-level event (Kineto indents them by 2, nested by 4+)
_SUB_RE = re.compile(rb'"(ts|id|External id|correlation)": (-?\d+)|"ProfilerStep#(\d+)"')
_DUR_RE = re.compile(rb'"dur": (\d+)')
_TS_RE = re.compile(rb'"ts": (\d+)')


def build_trace(dest: Path, target_bytes: int) -> tuple[int, int]:
    """Write the replicated trace to ``dest``; returns (events, copies)."""
    raw = gzip.decompress(SOURCE.read_bytes())
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
    fixed = len(head) + len(tail) + sum(len(c) + 1 for c in special)
    copies = max(1, round((target_bytes - fixed) / (len(reg_body) + 1)))

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

    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(head)
        for k in range(copies):
            if k:
                fh.write(b",")
            fh.write(shifted(k))
        for c in special:
            fh.write(b"," + special_chunk(c))
        fh.write(tail)
    os.replace(tmp, dest)
    return copies * len(regular) + len(special), copies


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
print(os.waitstatus_to_exitcode(status), wall, ru.ru_maxrss * 1024)
"""


def measure(cmd: list[str], log: Path) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one fresh child process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _LAUNCHER, str(log), *cmd], env=env, cwd=str(log.parent),
                       capture_output=True, text=True)
    text = log.read_text(errors="replace") if log.exists() else ""
    if p.returncode != 0:
        raise SystemExit(f"launcher failed ({p.returncode}):\n{p.stderr[-2000:]}")
    rc, wall, rss = p.stdout.split()
    if int(rc) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({rc}):\n{text[-2000:]}")
    return float(wall), int(rss), text


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
            wall, rss, out = measure(cmd_of(i), tmp / "child.log")
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
    wall, rss, _ = measure([py, "-c", "import distprof.importers.run, distprof.storage"], tmp / "child.log")
    print(f"  (start + imports of distprof import alone: {wall:.2f} s, peak RSS {rss / 1e6:.0f} MB)")
    dt, dr = rows["distprof import"]
    jt, jr = rows["json.load"]
    ot, orr = rows["orjson.loads"]
    print(f"  distprof import time = {dt / jt:.2f}x json.load, {dt / ot:.2f}x orjson.loads")
    print(f"  distprof import peak RSS = {dr / json_bytes:.2f}x the JSON's size, {dr / jr:.3f}x json.load's "
          f"({jr / json_bytes:.1f}x the JSON), {dr / orr:.3f}x orjson's ({orr / json_bytes:.1f}x the JSON)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200, help="size of the trace JSON to build, MB (default 200)")
    ap.add_argument("--gz", action="store_true", help="also measure the same trace gzipped")
    ap.add_argument("--repeat", type=int, default=2, help="runs per measurement; best time, highest RSS (default 2)")
    ap.add_argument("--keep", metavar="DIR", help="build the trace in DIR and leave it there")
    args = ap.parse_args()
    if args.mb <= 0 or args.repeat < 1:
        ap.error("--mb must be > 0 and --repeat >= 1")

    with tempfile.TemporaryDirectory(prefix="dp-import-bench-") as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
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
