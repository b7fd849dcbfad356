"""What the safe shard write costs: built in memory then written with os.write, against HDF5 writing the file itself.

    python benchmarks/shard_write.py --events 1000000          # one window of 1 M events (synth.py's mix)

Each mode runs in a fresh process on the same tables (read back from a synthetic shard, so the data compress as a
capture's do): ``direct`` is the writer before the safe write path (h5py writes ``NAME.tmp`` on disk, fsync,
rename), ``core`` the writer now (HDF5's core driver, no backing store; ``os.write`` of the image, fsync, size check,
rename), ``bytesio`` the alternative (h5py on a BytesIO). Reported: the median wall time of `--repeat` writes and the
peak resident memory the writes added over the process with its tables loaded (ru_maxrss).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("direct", "core", "bytesio")


def _load(shard_path: str):
    from distprof.storage import read_shard, schema

    s = read_shard(shard_path)
    tables = {}
    for name in schema.TABLES:
        try:
            tables[name] = s.table(name)
        except Exception:  # noqa: BLE001 -- a table the synthetic shard lacks
            continue
    attrs = {k: v for k, v in s.attrs.items() if k not in ("format", "schema_version", "codec")}
    return tables, list(s.names), attrs


def _write(mode: str, path: Path, tables, strings, attrs, codec: str) -> int:
    import h5py

    from distprof.storage import writer

    if mode == "core":
        return writer.write_shard(path, tables, strings, attrs, codec=codec)
    if mode == "bytesio":
        bio = io.BytesIO()
        with h5py.File(bio, "w", libver=writer.LIBVER, track_order=False) as f:
            writer.populate(f, tables, strings, attrs, codec)
        return writer.write_durably(path, bio.getbuffer())
    tmp = path.with_name(path.name + ".tmp")  # direct: what the writer did before
    with h5py.File(tmp, "w", libver=writer.LIBVER, track_order=False) as f:
        writer.populate(f, tables, strings, attrs, codec)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path.stat().st_size


def child(mode: str, shard: str, out: str, repeat: int, codec: str) -> None:
    tables, strings, attrs = _load(shard)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, size = [], 0
    for i in range(repeat):
        t0 = time.perf_counter()
        size = _write(mode, Path(out) / f"{mode}{i}.h5", tables, strings, attrs, codec)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n = len(next(iter(tables["events"].values())))
    print(json.dumps({"mode": mode, "events": n, "bytes": size, "median_s": statistics.median(times),
                      "min_s": min(times), "added_rss_mb": (peak - base) / 1024}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events in the window")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--codec", default="zstd", choices=("zstd", "gzip"))
    p.add_argument("--child", nargs=3, metavar=("MODE", "SHARD", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child, args.repeat, args.codec)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "synth.py"), "--ranks", "1", "--windows", "1",
                        "--events", str(args.events), "-o", f"{d}/run"], check=True, capture_output=True)
        (shard,) = sorted(Path(d, "run").glob("*.h5"))
        for mode in MODES:
            out = Path(d, mode)
            out.mkdir()
            r = subprocess.run([sys.executable, __file__, "--repeat", str(args.repeat), "--codec", args.codec,
                                "--child", mode, str(shard), str(out)], check=True, capture_output=True, text=True)
            res = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{mode:8s} {res['events']:>9,} events  {res['bytes'] / 1e6:7.2f} MB  median {res['median_s']:.3f} s"
                  f"  min {res['min_s']:.3f} s  +{res['added_rss_mb']:.0f} MB peak RSS")


if __name__ == "__main__":
    main()
