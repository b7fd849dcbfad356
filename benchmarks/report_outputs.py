"""The terminal and HTML outputs of a big run's report: lines, bytes, and the time Chromium takes to draw the page.

    python benchmarks/scale.py --ranks 16384 --events 5000 --procs 2 --summaries --data /tmp/dp-scale-s
    python benchmarks/report_outputs.py /tmp/dp-scale-s/report-r16384-p2-s.json

The report is read back from its JSON (``Report.from_json``), so no run is re-analysed: the terminal summary is
rendered and its lines counted, the HTML report written and its size taken, and (with Chromium, chromedriver and
selenium, as the browser tests use them) the page opened headless and timed until it says its charts are drawn
(``data-dp-rendered``). The issue's bars at 16,384 ranks: ≤ 90 terminal lines, ≤ 5 MB of HTML, drawn within 10 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def draw_seconds(html: Path) -> float | None:
    """Seconds from navigation to the page's rendered flag in headless Chromium; None without a browser."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        return None
    if not (chromium and driver):
        return None
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1000"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        drv.set_page_load_timeout(300)
        t0 = time.perf_counter()
        drv.get(html.resolve().as_uri())
        WebDriverWait(drv, 300).until(lambda d: d.execute_script(
            "return document.body.getAttribute('data-dp-rendered')"))
        return time.perf_counter() - t0
    finally:
        drv.quit()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report_json", help="a report.json (distprof report --json)")
    ap.add_argument("--no-browser", action="store_true", help="skip the draw time")
    args = ap.parse_args(argv)
    from distprof.analysis.report.model import Report
    from distprof.render import render_console, write_html

    report = Report.from_json(json.loads(Path(args.report_json).read_text()))
    lines = render_console(report).count("\n")
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(write_html(report, Path(tmp) / "report.html"))
        size = html.stat().st_size
        draw = None if args.no_browser else draw_seconds(html)
    n = len(json.loads(Path(args.report_json).read_text())["run"].get("ranks_present") or [])
    print(f"{args.report_json}: {n} ranks; terminal {lines} lines; HTML {size / 1e6:.2f} MB; "
          f"drawn in {'-' if draw is None else f'{draw:.1f} s'} (headless Chromium)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
