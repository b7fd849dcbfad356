"""Test-only Holistic Trace Analysis (HTA) environment: a separate venv holding ``HolisticTraceAnalysis==0.5.0``.

HTA pins heavy dependencies (jupyterlab, pandas, plotly, ...), so it never goes into distprof's own environment. This
file has two roles and imports only the standard library at module level:

* In the test environment: ``ensure_venv()`` builds (or reuses) the venv, ``run_probe(trace_dir)`` runs this file
  inside it and returns HTA's figures as a dict.
* Inside the venv: ``python hta_env.py probe TRACE_DIR`` loads the traces with ``hta.trace_analysis.TraceAnalysis``
  and prints one JSON object on stdout.

Command line (for humans and CI)::

    python3 tests/hta_env.py build                 # build or check the venv; prints its python and the build time
    python3 tests/hta_env.py probe TRACE_DIR       # build if needed, then print HTA's figures for TRACE_DIR

The venv lives in ``$DISTPROF_HTA_VENV`` or ``~/.cache/distprof/hta-venv``; it is reused while the stamp file matches
the requirement and ``import hta`` works, rebuilt otherwise. A file lock keeps parallel test processes from building it
twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HTA_REQUIREMENT = "HolisticTraceAnalysis==0.5.0"
STAMP = ".distprof-hta-ok"
BUILD_TIMEOUT_S = 1200
#: pip output that means "no route to the package index" rather than a broken package.
OFFLINE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No route to host",
    "ConnectTimeoutError",
    "ProxyError",
    "Could not find a version that satisfies the requirement",  # what pip says offline: "(from versions: none)"
)


class HtaEnvError(RuntimeError):
    """The HTA venv could not be built or used. ``offline`` is True when the package index was unreachable."""

    def __init__(self, message: str, offline: bool = False):
        super().__init__(message)
        self.offline = offline


def venv_dir() -> Path:
    env = os.environ.get("DISTPROF_HTA_VENV")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "distprof" / "hta-venv"


def venv_python(root: Path | None = None) -> Path:
    root = root or venv_dir()
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _works(py: Path, root: Path) -> bool:
    stamp = root / STAMP
    if not py.exists() or not stamp.exists() or stamp.read_text().strip() != HTA_REQUIREMENT:
        return False
    r = subprocess.run([str(py), "-c", "import hta.trace_analysis"], capture_output=True, text=True, timeout=120)
    return r.returncode == 0


def ensure_venv() -> tuple[Path, float]:
    """Return (python of the HTA venv, seconds spent building it; 0.0 when reused). Raises HtaEnvError."""
    root = venv_dir()
    py = venv_python(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / (root.name + ".lock")
    with open(lock_path, "w") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        if _works(py, root):
            return py, 0.0
        t0 = time.perf_counter()
        shutil.rmtree(root, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "venv", str(root)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise HtaEnvError(f"python -m venv {root} failed: {(r.stderr or r.stdout).strip()[-800:]}")
        cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", HTA_REQUIREMENT]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            shutil.rmtree(root, ignore_errors=True)
            raise HtaEnvError(f"pip install {HTA_REQUIREMENT} took over {BUILD_TIMEOUT_S} s", offline=True) from None
        out = (r.stdout or "") + (r.stderr or "")
        if r.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            offline = any(m in out for m in OFFLINE_MARKERS)
            raise HtaEnvError(f"pip install {HTA_REQUIREMENT} into {root} failed"
                              + (" (package index unreachable)" if offline else "") + ": " + out.strip()[-800:],
                              offline=offline)
        (root / STAMP).write_text(HTA_REQUIREMENT + "\n")
        if not _works(py, root):
            raise HtaEnvError(f"{root}: HTA installed but `import hta.trace_analysis` fails")
        return py, time.perf_counter() - t0


def run_probe(trace_dir: str | os.PathLike, *, include_last_step: bool = False, timeout: float = 600) -> dict:
    """Load `trace_dir` with HTA in the venv; return the probe's JSON (see `_probe`)."""
    py, _ = ensure_venv()
    cmd = [str(py), str(Path(__file__).resolve()), "probe", str(trace_dir)]
    if include_last_step:
        cmd.append("--include-last-step")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise AssertionError(f"HTA probe failed ({r.returncode}) on {trace_dir}:\n{r.stdout[-2000:]}\n"
                             f"{r.stderr[-4000:]}")
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not last:
        raise AssertionError(f"HTA probe printed no JSON:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(last[-1])


# ---- inside the venv -------------------------------------------------------------------------------------------------


def _records(df) -> list[dict]:
    out = []
    for rec in df.to_dict(orient="records"):
        row = {}
        for k, v in rec.items():
            try:
                row[str(k)] = v.item() if hasattr(v, "item") else v
            except (ValueError, AttributeError):
                row[str(k)] = str(v)
            if isinstance(row[str(k)], float) and row[str(k)] != row[str(k)]:
                row[str(k)] = None  # NaN
        out.append(row)
    return out


def _probe(trace_dir: str, include_last_step: bool) -> dict:
    """What HTA makes of `trace_dir`: ranks, rows per category and stream, metadata, and where GPU kernels exist the
    temporal breakdown and the communication/computation overlap (default settings, visualize=False)."""
    import logging
    from importlib.metadata import version

    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=trace_dir, include_last_profiler_step=include_last_step)
    t_load = time.perf_counter() - t0
    sym = ta.t.symbol_table.get_sym_table()
    out: dict = {
        "versions": {p: version(p) for p in ("HolisticTraceAnalysis", "pandas", "numpy")},
        "ranks": sorted(int(r) for r in ta.t.traces),
        "files": {str(r): os.path.basename(p) for r, p in sorted(ta.t.trace_files.items())},
        "per_rank": {},
        "timings_s": {"import": round(t_import, 3), "load": round(t_load, 3)},
    }
    has_gpu = False
    for r in sorted(ta.t.traces):
        df = ta.t.traces[r]
        cats = df["cat"].map(lambda i: sym[int(i)]).value_counts().to_dict()
        gpu = df[df["stream"] >= 0] if "stream" in df.columns else df.iloc[0:0]
        kern = gpu[gpu["cat"].map(lambda i: sym[int(i)]) == "kernel"]
        has_gpu = has_gpu or len(kern) > 0
        names = df["name"].map(lambda i: sym[int(i)])
        meta = ta.t.meta_data.get(r, {})
        out["per_rank"][str(r)] = {
            "rows": int(len(df)),
            "by_cat": {str(k): int(v) for k, v in sorted(cats.items())},
            "gpu_rows": int(len(gpu)),
            "kernels_per_stream": {str(int(k)): int(v) for k, v in sorted(kern["stream"].value_counts().items())},
            "profiler_steps": sorted(n for n in set(names) if n.startswith("ProfilerStep#")),
            "iterations": [int(i) for i in ta.t.get_iterations(r)],
            "correlated_kernels": int((kern["correlation"] > 0).sum()) if "correlation" in kern else 0,
            "dur_sum_us": int(df["dur"].sum()),
            "distributedInfo": meta.get("distributedInfo"),
            "n_deviceProperties": len(meta.get("deviceProperties") or []),
            "baseTimeNanoseconds": meta.get("baseTimeNanoseconds"),
        }
    if has_gpu:
        t0 = time.perf_counter()
        out["temporal_breakdown"] = _records(ta.get_temporal_breakdown(visualize=False))
        out["comm_comp_overlap"] = _records(ta.get_comm_comp_overlap(visualize=False))
        out["timings_s"]["analyses"] = round(time.perf_counter() - t0, 3)
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "build":
        py, spent = ensure_venv()
        print(json.dumps({"python": str(py), "build_s": round(spent, 1)}))
        return 0
    if len(argv) >= 2 and argv[0] == "probe":
        include_last = "--include-last-step" in argv[2:]
        try:
            import hta  # noqa: F401  (are we inside the venv?)
        except ImportError:
            print(json.dumps(run_probe(argv[1], include_last_step=include_last)))
            return 0
        print(json.dumps(_probe(argv[1], include_last)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
