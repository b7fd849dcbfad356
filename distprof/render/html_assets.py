"""Static assets of the HTML report: the page CSS, the boot script that draws the figures, and plotly.js (read from
the ``plotly`` package, inlined plain or gzip + base64 for the browser's ``DecompressionStream``; cached per process).
"""

from __future__ import annotations

import base64
import functools
import gzip


@functools.lru_cache(maxsize=2)
def _plotly_js(compressed: bool) -> str:
    from plotly.offline import (
        get_plotlyjs,  # only the bundled JS file is read; no graph_objects
    )

    js = get_plotlyjs()
    if "</script" in js.lower():  # never seen; keep the inline element intact if a future bundle has one
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    if not compressed:
        return js
    return base64.b64encode(gzip.compress(js.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


_CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f6f7f9;color:#1d2330;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:22px;margin:0 0 4px}
h1 .runid{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
h2{font-size:17px;margin:0 0 6px}
h3{font-size:14px;margin:14px 0 6px}
.meta{color:#4a5366;margin:0 0 14px}
.verdict{background:#fff;border-left:5px solid #d62728;padding:12px 16px;font-size:16px;border-radius:4px;
  box-shadow:0 1px 2px rgba(0,0,0,.08);margin-bottom:18px}
.verdict .label{font-weight:700;text-transform:uppercase;font-size:12px;letter-spacing:.06em;color:#d62728;
  margin-right:6px}
section{background:#fff;border-radius:6px;padding:14px 16px;margin:0 0 16px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.grid{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:16px;margin:0 0 16px}
.grid>section{margin:0}
@media (max-width:1000px){.grid{grid-template-columns:1fr}}
.caption{color:#4a5366;margin:0 0 6px;font-size:13px}
.muted{color:#7a8396}
.warn{color:#b00020}
ul.findings{list-style:none;margin:0;padding:0}
li.finding{padding:8px 0;border-top:1px solid #eceef2}
li.finding:first-child{border-top:none}
.badge{display:inline-block;min-width:58px;text-align:center;border-radius:10px;padding:1px 8px;font-size:11px;
  font-weight:700;text-transform:uppercase;color:#fff;vertical-align:1px}
.badge.high{background:#d62728}.badge.medium{background:#f28e2b}.badge.low{background:#7a8396}
.ftitle{font-weight:600}
.where{color:#4a5366;font-size:12px;margin-left:6px}
.evidence,.advice,.metrics{margin:3px 0 0 66px}
.metrics{color:#7a8396;font-size:12px;font-family:ui-monospace,Menlo,Consolas,monospace}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
th{background:#f3f4f7;font-weight:600}
table.num td+td{font-variant-numeric:tabular-nums}
td:first-child{word-break:break-all}
ul.warnings{margin:0;padding-left:20px}
footer{color:#7a8396;font-size:12px;text-align:center;margin-top:10px}
.chart-error{color:#b00020;padding:12px}
"""

_BOOT_JS = """
(function () {
  "use strict";
  var figs = JSON.parse(document.getElementById("dp-figures").textContent);
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  function fail(msg) {
    Object.keys(figs).forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      var p = document.createElement("p");
      p.className = "chart-error";
      p.textContent = msg;
      el.replaceChildren(p);
    });
    document.body.setAttribute("data-dp-rendered", "error");
  }
  function draw() {
    if (!window.Plotly) { fail("plotly.js did not load; the charts cannot be drawn."); return; }
    var done = Object.keys(figs).map(function (id) {
      var f = figs[id];
      return Promise.resolve(Plotly.newPlot(id, f.data, f.layout, config)).catch(function (e) {
        var p = document.createElement("p");
        p.className = "chart-error";
        p.textContent = "chart failed: " + e;
        document.getElementById(id).replaceChildren(p);
        throw e;
      });
    });
    Promise.all(done).then(function () { document.body.setAttribute("data-dp-rendered", "ok"); },
                           function (e) { document.body.setAttribute("data-dp-rendered", "error"); console.error(e); });
  }
  var packed = document.getElementById("dp-plotly-gz");
  if (!packed) { draw(); return; }
  if (typeof DecompressionStream === "undefined") {
    fail("This browser lacks DecompressionStream (needed to unpack the inlined plotly.js): open the report in a"
         + " current Chrome, Edge, Firefox or Safari, or regenerate it with compress_js=False.");
    return;
  }
  var bin = atob(packed.textContent.trim());
  var bytes = new Uint8Array(bin.length);
  for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  new Response(stream).text().then(function (js) {
    var s = document.createElement("script");
    s.textContent = js;
    document.head.appendChild(s);
    draw();
  }, function (e) { fail("could not unpack plotly.js: " + e); });
})();
"""


def _plotly_element(compressed: bool) -> str:
    """The <script> element that carries plotly.js: packed (unpacked by ``_BOOT_JS``) or plain."""
    if compressed:
        return ("<script type=\"application/octet-stream\" id=\"dp-plotly-gz\">"
                + _plotly_js(True) + "</script>")
    return "<script>" + _plotly_js(False) + "</script>"
