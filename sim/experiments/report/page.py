"""One self-contained HTML page: headings, tables, notes and interactive charts.

The charts are plotly.js figures given as plain dicts (``{"data": [...], "layout": {...}}``); the
page embeds plotly.js once, inline, and every figure's JSON in a ``<script type="application/json">``
block, so it works offline from a ``file://`` address with no server and no network. The bytes
depend only on what was added (no time stamps, no random element ids): the same result folder
gives the same report.

A small script before plotly.js collects script errors and shows them in a red box at the top
(``#report-errors``), and each chart that drew is marked ``data-rendered="1"``: a reader sees a
broken chart rather than a silent gap, and the browser test reads both from the rendered page.
"""
from __future__ import annotations

import html
import json
import math
from typing import Any

import numpy as np

#: Written into every report; a ``report.html`` without it was not made by priosim and is never
#: replaced (:func:`is_priosim_report`).
GENERATOR = "priosim report"
GENERATOR_TAG = f'<meta name="generator" content="{GENERATOR}">'

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1360px;
padding:16px 24px;color:#222;background:#fff}
h1{font-size:1.55em;margin:.2em 0}h2{font-size:1.2em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd;
padding-bottom:.2em}h3{font-size:1em;margin:1em 0 .3em}
.sub{color:#555;margin:.2em 0 1em}.note{color:#555;font-size:.9em;margin:.3em 0}
table{border-collapse:collapse;font-size:.88em;margin:.4em 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:10px}
.chart{min-height:360px;border:1px solid #eee}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:.6em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:130px}
.card b{display:block;font-size:1.3em}.card span{color:#555;font-size:.85em}
.ok{color:#2a7d2a}.bad{color:#b22222}
pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:.82em;max-height:480px}
#report-errors{display:none;background:#fde8e8;border:1px solid #b22222;color:#b22222;padding:8px;
white-space:pre-wrap}
nav a{margin-right:12px}
"""

# Runs before plotly.js: script errors and console errors (plotly's too) go into the red box and
# are counted in <body data-errors>.
ERROR_HOOK = """
(function(){
  function show(msg){var b=document.getElementById('report-errors');if(!b){return;}
    b.style.display='block';b.textContent+=msg+'\\n';
    document.body.setAttribute('data-errors',String(1+Number(document.body.getAttribute('data-errors')||0)));}
  window.addEventListener('error',function(e){show('script error: '+e.message);});
  var ce=console.error;
  console.error=function(){show('console error: '+Array.prototype.join.call(arguments,' '));
    return ce.apply(console,arguments);};
})();
"""

DRAW = """
(function(){
  var blocks=document.querySelectorAll('script[type="application/json"][data-chart]');
  var drawn=0;
  blocks.forEach(function(s){
    var id=s.getAttribute('data-chart');var div=document.getElementById(id);
    try{
      var fig=JSON.parse(s.textContent);
      Plotly.newPlot(div,fig.data,fig.layout,{responsive:true,displaylogo:false}).then(function(){
        div.setAttribute('data-rendered','1');drawn+=1;
        document.body.setAttribute('data-charts-rendered',String(drawn));
      },function(err){console.error('chart '+id+' did not draw: '+err);});
    }catch(err){console.error('chart '+id+' did not draw: '+err);}
  });
})();
"""


def is_priosim_report(text: str) -> bool:
    """Whether an HTML file's text (its start is enough) was written by this module."""
    return GENERATOR_TAG in text[:4096]


def clean(obj: Any) -> Any:
    """``obj`` as strict-JSON-ready Python: numpy arrays and scalars become lists and numbers,
    NaN and infinities ``None`` (plotly draws a gap), so ``json.dumps(allow_nan=False)`` holds."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return clean(obj.tolist())
    if hasattr(obj, "to_numpy") and not isinstance(obj, str):  # (a pandas Series or Index)
        return clean(obj.to_numpy().tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)  # (a timestamp, a path: shown as text)


def to_json(obj: Any) -> str:
    """Strict JSON of ``obj`` (see :func:`clean`), safe inside a ``<script>`` element."""
    text = json.dumps(clean(obj), allow_nan=False, separators=(",", ":"), sort_keys=False)
    return text.replace("</", "<\\/")  # ("\/" is a JSON escape of "/": the text parses the same)


def fmt(v: Any, digits: int = 4) -> str:
    """A table cell: numbers with ``digits`` significant digits, missing values as ``-``."""
    if v is None:
        return "-"
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{digits}g}"
    return str(v)


class Page:
    """An HTML report being built: call the methods in reading order, then :meth:`html`."""

    def __init__(self, title: str, subtitle: str = ""):
        self.title, self.subtitle = title, subtitle
        self.parts: list[str] = []
        self.nav: list[tuple[str, str]] = []
        self.charts = 0

    # ---- structure -------------------------------------------------------------------------------
    def section(self, title: str) -> None:
        anchor = f"s{len(self.nav) + 1}"
        self.nav.append((anchor, title))
        self.parts.append(f'<h2 id="{anchor}">{html.escape(title)}</h2>')

    def heading(self, title: str) -> None:
        self.parts.append(f"<h3>{html.escape(title)}</h3>")

    def note(self, text: str) -> None:
        self.parts.append(f'<p class="note">{html.escape(text)}</p>')

    def cards(self, items: list[tuple[str, Any, str]]) -> None:
        """Headline numbers: (label, value, css class: "", "ok" or "bad")."""
        cells = "".join(f'<div class="card"><b class="{c}">{html.escape(fmt(v))}</b><span>{html.escape(k)}</span></div>'
                        for k, v, c in items)
        self.parts.append(f'<div class="cards">{cells}</div>')

    def table(self, rows: list[dict], columns: list[str] | None = None, digits: int = 4) -> None:
        if not rows:
            self.note("(none)")
            return
        cols = columns or list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c), digits))}</td>" for c in cols) + "</tr>"
                       for r in rows)
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def pairs(self, items: dict) -> None:
        """A two-column table of settings (key, value)."""
        self.table([{"setting": k, "value": v} for k, v in items.items()], ["setting", "value"])

    def pre(self, summary: str, text: str) -> None:
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>")

    def open_grid(self) -> None:
        self.parts.append('<div class="grid">')

    def close_grid(self) -> None:
        self.parts.append("</div>")

    def chart(self, fig: dict, height: int = 380) -> str:
        """Add a plotly figure (``{"data": [...], "layout": {...}}``); returns its element id."""
        self.charts += 1
        cid = f"chart-{self.charts}"
        layout = {"height": height, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
                  "legend": {"font": {"size": 11}}, **fig.get("layout", {})}
        doc = {"data": fig["data"], "layout": layout}
        self.parts.append(f'<div class="chart" id="{cid}" style="min-height:{height}px"></div>'
                          f'<script type="application/json" data-chart="{cid}">{to_json(doc)}</script>')
        return cid

    # ---- the page --------------------------------------------------------------------------------
    def html(self, plotly_js: str) -> str:
        nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in self.nav)
        return "".join([
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">", GENERATOR_TAG,
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style>",
            f"<script>{ERROR_HOOK}</script><script>{plotly_js}</script></head>\n<body>",
            '<div id="report-errors"></div>',
            f"<h1>{html.escape(self.title)}</h1>",
            f'<p class="sub">{html.escape(self.subtitle)}</p>' if self.subtitle else "",
            f"<nav>{nav}</nav>\n", "\n".join(self.parts),
            f"\n<script>{DRAW}</script></body></html>\n",
        ])


# ---- figure pieces shared by the kinds ---------------------------------------------------------------
def colors(names: list[str], offset: int = 0) -> dict[str, str]:
    return {n: PALETTE[(i + offset) % len(PALETTE)] for i, n in enumerate(names)}


def layout(title: str, xtitle: str = "", ytitle: str = "", **extra) -> dict:
    out = {"title": {"text": title, "font": {"size": 14}}, "xaxis": {"title": {"text": xtitle}},
           "yaxis": {"title": {"text": ytitle}}, "hovermode": "closest"}
    for k, v in extra.items():
        if k in ("xaxis", "yaxis") and isinstance(v, dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def vline(x: float, color: str, name: str, y: tuple[float, float] = (0.0, 1.0)) -> dict:
    """A dashed vertical line at ``x`` from ``y[0]`` to ``y[1]``, as a trace: it has a legend
    entry and a hover text, and a click on the legend hides it."""
    return {"type": "scatter", "mode": "lines", "x": [x, x], "y": list(y), "name": name,
            "line": {"color": color, "dash": "dash", "width": 1.5}, "hovertemplate": f"{name}<extra></extra>"}


def hline(y: float, x: tuple[float, float], color: str, name: str) -> dict:
    """A dashed horizontal line at ``y`` from ``x[0]`` to ``x[1]``, as a trace (see :func:`vline`)."""
    return {"type": "scatter", "mode": "lines", "x": list(x), "y": [y, y], "name": name,
            "line": {"color": color, "dash": "dash", "width": 1.5}, "hovertemplate": f"{name}<extra></extra>"}


def empty(title: str, why: str) -> dict:
    """A chart with nothing to draw: its axes and a centred sentence saying why."""
    return {"data": [], "layout": layout(title, annotations=[
        {"text": why, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False}],
        xaxis={"visible": False}, yaxis={"visible": False})}
