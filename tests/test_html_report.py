"""The self-contained HTML report: figures from the report, escaping, no network, and (with Chromium) what a browser
really shows: charts drawn, no console error, no script from the trace run, the hostile names visible as text."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import distprof
import numpy as np
import pytest

from conftest import ARTIFACTS, job_env, only_run_dir, torchrun
from distprof.analysis import load_run
from distprof.analysis.cross.annotations import Annotation, AnnotationRank
from distprof.analysis.cross.memory_timeline import MAX_POINTS_PER_RANK, MEMORY_LINES
from distprof.analysis.cross.rootcause import RootCauseOp
from distprof.analysis.findings.finding import Finding
from distprof.analysis.rank.summary import downsample_minmax
from distprof.analysis.report.build import build_report
from distprof.analysis.report.model import Report, RunInfo
from distprof.cli import main
from distprof.errors import ConfigError
from distprof.render import render_html, write_html

EVIL = "<script>alert(1)</script>"
EVIL_IMG = "<img src=x onerror=alert(2)>"
EVIL_SEP = "a\u2028b</script><!--c"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from synth import make_run

    out = tmp_path_factory.mktemp("html")
    sr = make_run(out, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2, late_ms=30,
                  schedule={"wait": 1, "warmup": 1, "active": 4})
    run = distprof.load(sr.run_dir, progress=False)
    return sr.run_dir, run, build_report(run)


def hostile(rep: Report) -> Report:
    """The report with hostile strings wherever a name from the trace or the user can reach the page."""
    rep = copy.deepcopy(rep)
    rep.run.id = EVIL + "&run"
    rep.run.hosts = {k: EVIL_IMG for k in rep.run.hosts}
    for s in rep.stragglers:
        s.host = EVIL_IMG
    rep.verdict = f"rank 2 is slow in {EVIL}."
    rep.findings = [
        Finding("straggler_rank", "high", 2, EVIL_IMG, f"slow {EVIL}", "a < b && c > d", EVIL_SEP,
                {"lateness_ms": 30.0, "bad": float("nan")}),
        Finding("tiny_ops", "low", None, None, "tiny ops", "", "", {}),
    ]
    rep.annotations = [
        Annotation(EVIL, {str(r): AnnotationRank(1.0 + r, 1.0) for r in range(4)}, 100.0),
        Annotation(EVIL_IMG, {"0": AnnotationRank(0.5, 2.0)}, None),
        Annotation(EVIL_SEP, {"1": AnnotationRank(0.25, 3.0)}, None),
    ]
    rep.warnings = list(rep.warnings) + [f"warning about {EVIL}"]
    if rep.root_cause:
        rep.root_cause[0].ops.append(RootCauseOp(EVIL_IMG, "user_annotation", excess_ms=1.0, excess_ms_per_step=0.25,
                                                 rank_ms_per_step=0.5, others_median_ms_per_step=0.25,
                                                 calls_per_step=1.0))
    return rep


def figures(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="dp-figures">(.*?)</script>', page, re.S)
    assert m, "figure JSON missing"
    return json.loads(m.group(1))


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


# ---------------------------------------------------------------------------------------------------------------
# without a browser


def test_figures_follow_the_report(synth):
    run_dir, _, rep = synth
    figs = figures(render_html(rep))
    assert {"fig-steps", "fig-breakdown", "fig-blame", "fig-overlap", "fig-imbalance", "fig-memory"} <= set(figs)

    # heatmap: one cell per (rank, step) with its lateness shown, its step time the second view
    late, hm = figs["fig-steps"]["data"]
    assert late["name"] == "lateness" and late.get("visible", True) is True and hm["visible"] is False
    cells = rep.straggler_info.cells
    for rank, step, lat in zip(cells.rank, cells.step, cells.lateness_ms):
        assert late["z"][late["y"].index(f"rank {rank}")][late["x"].index(str(step))] == pytest.approx(lat, abs=1e-3)
    assert [b["label"] for b in figs["fig-steps"]["layout"]["updatemenus"][0]["buttons"]] == ["lateness", "step time"]
    steps = rep.steps
    assert len(steps) == 16
    for rank, step, step_ms in zip(steps["rank"], steps["step"], steps["step_ms"]):
        i = hm["y"].index(f"rank {rank}")
        j = hm["x"].index(str(step))
        assert hm["z"][i][j] == pytest.approx(step_ms, abs=1e-3)

    # breakdown: the stacked parts add up to the mean step time of each rank
    bars = figs["fig-breakdown"]["data"]
    for k, label in enumerate(bars[0]["x"]):
        r = int(label.split()[1])
        mean_step = np.mean(steps["step_ms"][steps["rank"] == r])
        assert sum(t["y"][k] for t in bars) == pytest.approx(mean_step, rel=1e-3)

    # blame: ranks grouped by host, the named straggler (rank 2) red
    blame = figs["fig-blame"]["data"][0]
    hosts, ranks = blame["x"]
    assert hosts == sorted(hosts) and ranks.index("rank 2") == hosts.index("sim-host1")
    assert blame["marker"]["color"][ranks.index("rank 2")] != blame["marker"]["color"][ranks.index("rank 0")]
    assert max(blame["y"]) == blame["y"][ranks.index("rank 2")]

    # imbalance: four panels, each with its mean marked
    imb = figs["fig-imbalance"]
    assert len(imb["data"]) == 4 and len(imb["layout"]["shapes"]) == 4
    flops = imb["data"][1]["y"]
    assert imb["layout"]["shapes"][1]["y0"] == pytest.approx(np.mean(flops))

    # memory: one line per rank; the min/max downsampling keeps each rank's peak
    mem = figs["fig-memory"]["data"]
    assert [t["name"] for t in mem] == [f"rank {r}" for r in range(4)]
    for r, t in enumerate(mem):
        ys = [y for y in t["y"] if y is not None]
        assert len(ys) <= MAX_POINTS_PER_RANK + 8
        mem_r = load_run(run_dir, progress=False).memory
        sel = mem_r["rank"] == r
        assert max(ys) == pytest.approx(mem_r["total_bytes"][sel].max() / 2**20, abs=1e-3)


def test_hostile_names_are_escaped_everywhere(synth):
    _, _, rep = synth
    page = render_html(hostile(rep))
    assert EVIL not in page and EVIL_IMG not in page and "</script><!--" not in page
    assert "\u2028" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text in the HTML parts
    # exactly our three script elements (figure JSON, packed plotly.js, boot code); nothing from the data
    assert page.count("<script") == 3 and page.count("</script>") == 3
    figs = figures(page)  # still valid JSON after the \u escapes
    ann = figs["fig-annotations"]["data"][0]
    assert ann["y"][0] == "&lt;script&gt;alert(1)&lt;/script&gt;"  # entity-escaped for plotly's pseudo-HTML
    assert figs["fig-blame"]["data"][0]["x"][0][0] == "&lt;img src=x onerror=alert(2)&gt;"


@pytest.mark.parametrize("compress", [True, False])
def test_no_external_urls(synth, compress):
    _, _, rep = synth
    page = render_html(hostile(rep), compress_js=compress)
    p = _Tags()
    p.feed(page)
    tags = {t for t, _ in p.tags}
    assert not tags & {"link", "iframe", "img", "object", "embed", "base"}, tags
    for tag, attrs in p.tags:
        for key in ("src", "href", "action", "data", "poster"):
            v = (attrs.get(key) or "").strip().lower()
            assert not v.startswith(("http:", "https:", "//", "ftp:")), (tag, key, v)
        if tag == "script":
            assert "src" not in attrs
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert "url(" not in css and "@import" not in css


def test_sizes_and_packing(synth):
    _, _, rep = synth
    packed, plain = render_html(rep), render_html(rep, compress_js=False)
    assert 'id="dp-plotly-gz"' in packed and 'id="dp-plotly-gz"' not in plain
    assert len(packed) < 0.5 * len(plain)  # gzip+base64 of plotly.js: ~2.0 MB instead of ~4.8 MB
    assert len(packed) < 3_000_000


def test_downsample_keeps_extremes_in_time_order():
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.integers(1, 100, 50_000))
    v = np.cumsum(rng.normal(0, 1, 50_000))
    v[12_345] = 1e6  # a spike the timeline must not lose
    ts, vs = downsample_minmax(t, v, 1000)
    assert len(ts) <= 1000 and np.all(np.diff(ts) > 0)
    assert vs.max() == v.max() and vs.min() == v.min()
    assert set(ts.tolist()) <= set(t.tolist())
    t2, v2 = downsample_minmax(t[:10], v[:10], 1000)
    assert np.array_equal(t2, t[:10]) and np.array_equal(v2, v[:10])


def _memory_section(page: str) -> str:
    return re.search(r'<section class="chart-section"><h2>Memory timeline per rank</h2>.*?</section>', page).group(0)


def test_partial_reports_render(synth):
    _, _, rep = synth
    minimal = render_html(Report(verdict="", findings=[], run=RunInfo(id="x", world_size=0)))
    assert "distprof report" in minimal and figures(minimal) == {}
    assert "No recorded steps: nothing to analyse." in minimal and "No profile window was recorded" in minimal
    no_verdict = dataclasses.replace(rep, verdict="", findings=[], annotations=None)
    page = render_html(no_verdict)
    verdict = re.search(r'<div class="verdict" id="verdict">(.*?)</div>', page, re.S).group(1)
    assert "rank 2" in verdict and "straggler" in verdict  # built from report.stragglers
    assert "No findings: no rule fired." in page and "no annotations table" in page


def test_a_report_read_back_renders_the_same_page_but_the_memory_timeline(synth):
    _, _, rep = synth
    page = render_html(rep, compress_js=False)
    back = render_html(Report.from_json(json.loads(json.dumps(rep.to_json()))), compress_js=False)
    assert "fig-memory" in figures(page) and "fig-memory" not in figures(back)  # report.json has no memory curves
    assert "the memory timeline is not in report.json" in _memory_section(back).lower()
    assert {k: v for k, v in figures(page).items() if k != "fig-memory"} == figures(back)

    def rest(p: str) -> str:  # the page but its memory section and the figure JSON (compared above)
        return re.sub(r'(id="dp-figures">).*?(</script>)', r"\1\2", p.replace(_memory_section(p), ""), flags=re.S)

    assert rest(page) == rest(back)


def test_cli_writes_html(synth, tmp_path, capsys):
    run_dir, _, _ = synth
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--html", str(out), "--no-progress"]) == 0
    assert f"HTML report written to {out}" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "fig-memory" in figures(page)
    assert not list(tmp_path.glob("*.tmp"))
    # --json - keeps stdout pure JSON
    out2 = tmp_path / "r2.html"
    assert main(["report", str(run_dir), "--json", "-", "--html", str(out2)]) == 0
    cap = capsys.readouterr()
    json.loads(cap.out)
    assert out2.exists() and "HTML report written" in cap.err


def test_cli_bad_html_path(synth, tmp_path, capsys):
    run_dir, _, rep = synth
    assert main(["report", str(run_dir), "--html", str(tmp_path / "nope" / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distprof: error: --html") and "does not exist" in err[0]
    with pytest.raises(ConfigError, match="is a directory"):
        write_html(rep, tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# in headless Chromium


def _browser_missing() -> str | None:
    if not CHROMIUM:
        return "chromium not installed (launch/setup.sh installs Debian's chromium and chromium-driver)"
    if not CHROMEDRIVER:
        return "chromedriver not installed (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _browser_missing()
    if why:
        if os.environ.get("DISTPROF_REQUIRE_BROWSER") == "1":  # CI sets it: a missing browser is a failure there
            pytest.fail(f"DISTPROF_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-dev-shm-usage", "--window-size=1300,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.set_capability("unhandledPromptBehavior", "ignore")  # an alert stays open, so we can see it fired
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(120)
    try:
        yield drv
    finally:
        drv.quit()


def open_report(drv, path: Path, shot: str) -> dict:
    """Load the page, wait for the charts, and return what the browser saw."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.support.ui import WebDriverWait

    drv.get_log("browser")  # drop messages of earlier pages
    drv.set_window_size(1300, 1000)
    drv.get(path.resolve().as_uri())
    alert = None
    try:
        WebDriverWait(drv, 90).until(
            lambda d: d.execute_script("return document.body.getAttribute('data-dp-rendered')"))
    except Exception:
        try:
            alert = drv.switch_to.alert.text
        except NoAlertPresentException:
            raise
    if alert is None:
        try:
            alert = drv.switch_to.alert.text
        except NoAlertPresentException:
            pass
    assert alert is None, f"the page opened an alert: {alert!r}"
    charts = drv.execute_script("""
        return Array.from(document.querySelectorAll('div.chart')).map(function (el) {
          return {id: el.id, svgs: el.querySelectorAll('svg.main-svg').length,
                  traces: (el._fullData || []).length, height: el.getBoundingClientRect().height,
                  drawn: el.querySelectorAll('.point, .js-line, .hm image').length};  // bars/markers, lines, heatmaps
        });""")
    info = {
        "state": drv.execute_script("return document.body.getAttribute('data-dp-rendered')"),
        "charts": charts,
        "text": drv.execute_script("return document.body.innerText"),
        "ticks": drv.execute_script(
            "return Array.from(document.querySelectorAll('.xtick text, .ytick text, .x2tick text'))"
            ".map(function (t) { return t.textContent; })"),
        "severe": [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"],
    }
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1300, min(int(height) + 40, 12000))
    ARTIFACTS.mkdir(exist_ok=True)
    drv.save_screenshot(str(ARTIFACTS / shot))
    return info


def assert_charts_drawn(info: dict, expected: set[str]) -> None:
    assert info["state"] == "ok", info["state"]
    by_id = {c["id"]: c for c in info["charts"]}
    assert expected <= set(by_id), set(by_id)
    for cid, c in by_id.items():
        assert c["svgs"] >= 1 and c["traces"] >= 1 and c["drawn"] >= 1 and c["height"] > 100, c
    assert not info["severe"], info["severe"]


@pytest.mark.slow
def test_browser_renders_hostile_synth_report(synth, browser, tmp_path):
    _, _, rep = synth
    path = write_html(hostile(rep), tmp_path / "hostile.html")
    info = open_report(browser, path, "html-report-hostile.png")
    assert_charts_drawn(info, {"fig-steps", "fig-breakdown", "fig-blame", "fig-overlap", "fig-imbalance",
                               "fig-memory", "fig-annotations"})
    # the hostile names are visible as text: in the HTML parts and in plotly's own labels
    assert EVIL in info["text"] and EVIL_IMG in info["text"] and "a < b && c > d" in info["text"]
    assert EVIL in info["ticks"] and EVIL_IMG in info["ticks"]
    assert browser.execute_script("return document.querySelectorAll('img').length") == 0


@pytest.mark.slow
def test_browser_renders_plain_js(synth, browser, tmp_path):
    _, _, rep = synth
    path = write_html(rep, tmp_path / "plain.html", compress_js=False)
    info = open_report(browser, path, "html-report-plain-js.png")
    assert_charts_drawn(info, {"fig-steps", "fig-breakdown", "fig-blame", "fig-memory"})


TRAIN_EVIL = textwrap.dedent('''
    import os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import record_function
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(7):
        x = torch.randn(16, 64)
        with record_function("<script>alert(1)</script>"):
            y = model(x).sum()
            if rank == 1:
                time.sleep(0.03)  # rank 1 is the straggler, and the time is inside the hostile region
        y.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_browser_real_job_record_function_is_escaped(browser, tmp_path):
    script = tmp_path / "evil_train.py"
    script.write_text(TRAIN_EVIL)
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "1", "--warmup", "1", "--active", "3",
                 str(script)], cwd=tmp_path, env=job_env())
    run_dir = only_run_dir(tmp_path / "out")
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    assert main(["report", str(run_dir), "--html", str(html_path), "--json", str(json_path), "--no-progress"]) == 0
    rep = json.loads(json_path.read_text())
    assert EVIL in json.dumps(rep, ensure_ascii=False), "the record_function name did not reach the report"
    page = html_path.read_text(encoding="utf-8")
    assert EVIL not in page
    info = open_report(browser, html_path, "html-report-real-job.png")
    assert_charts_drawn(info, {"fig-steps", "fig-breakdown", "fig-memory"})
    assert EVIL in info["text"]


# ---------------------------------------------------------------------------------------------------------------
# many ranks: distributions and aggregates instead of one bar or line per rank


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """96 ranks on 12 hosts (benchmarks/synth.py), rank 50 slow: more than html_scale.MANY_RANKS."""
    from conftest import bench_module

    mod = bench_module("synth")
    out = tmp_path_factory.mktemp("many") / "run"
    mod.generate(mod.spec_from(mod.parse_args(["--ranks", "96", "--hosts", "12", "--events", "1200", "--steps", "3",
                                               "--windows", "1", "--slow-rank", "50", "--slow-ms", "15",
                                               "-o", str(out)])), out)
    run = distprof.load(out, progress=False)
    return run, build_report(run)


def test_many_ranks_figures_are_distributions(many):
    from distprof.render import html_scale

    _, rep = many
    page = render_html(rep)
    figs = figures(page)
    late, heat = figs["fig-steps"]["data"]
    assert len(heat["y"]) == 12 and all(lbl.startswith("node") for lbl in heat["y"])  # one row per host
    assert all(t.startswith("rank ") for row in heat["text"] for t in row)  # each cell names its slowest rank
    assert late["y"] == heat["y"] and all(t.startswith("latest: rank ") for row in late["text"] for t in row)
    for fid in ("fig-breakdown", "fig-overlap", "fig-imbalance"):
        kinds = {t["type"] for t in figs[fid]["data"]}
        assert "box" in kinds and "bar" not in kinds, fid
        boxes = [t for t in figs[fid]["data"] if t["type"] == "box"]
        assert all(len(t["y"]) == 96 for t in boxes), fid
    labelled = [t for t in figs["fig-breakdown"]["data"] if t["type"] == "scatter"]
    assert any("rank 50" in t["text"] for t in labelled)  # the outlier is named
    blame = figs["fig-blame"]["data"][0]
    assert len(blame["y"]) <= html_scale.TOP_BLAME + 1 and "rank 50" in blame["x"][1]
    assert len(figs["fig-memory"]["data"]) <= MEMORY_LINES
    assert page.count("<tr>") < 80  # GPU time and clock tables show the worst rows, not 96
    assert len(page.encode()) < 2.4e6


def test_a_box_over_many_ranks_carries_its_statistics_not_every_value():
    """At 16k ranks a box of every rank's value made the page 5.2 MB; above BOX_SAMPLES values the box is its
    quartiles and fences, with at most BOX_OUTLIERS points beyond them and the extremes named."""
    import numpy as np

    from distprof.render import html_scale

    n = 16384
    vals = np.random.default_rng(1).normal(10.0, 0.5, n)
    vals[777] = 40.0  # the one that matters
    traces = html_scale._box("compute", vals.tolist(), list(range(n)), "#000")
    box, points, named = traces
    assert "y" not in box and box["median"][0] == pytest.approx(float(np.median(vals)), abs=1e-3)
    assert box["q1"][0] < box["median"][0] < box["q3"][0]
    assert box["lowerfence"][0] >= float(vals.min()) and box["upperfence"][0] < 40.0
    assert 0 < len(points["y"]) <= html_scale.BOX_OUTLIERS and 40.0 in points["y"]
    assert named["text"][0] == "rank 777"
    assert len(json.dumps(traces)) < 40_000
    small = html_scale._box("compute", vals[:100].tolist(), list(range(100)), "#000")
    assert len(small[0]["y"]) == 100  # few ranks: every value, as before


@pytest.mark.slow
def test_browser_renders_many_ranks(many, browser, tmp_path):
    _, rep = many
    path = write_html(rep, tmp_path / "many.html")
    info = open_report(browser, path, "html-report-96-ranks.png")
    assert_charts_drawn(info, {"fig-steps", "fig-breakdown", "fig-blame", "fig-overlap", "fig-imbalance",
                               "fig-memory"})
