"""``report.html``: one self-contained, interactive page per run.

The page holds the summary table (as ``summary.md``), the latency CDFs (TTFT, TPOT, E2E;
ms on a log axis, p50/p99 marked, timed-out requests at the timeout), the timeline
(batch size, KV use, queue length, busy/MBU/MFU; shared zoomable time axis with a range
slider) and the scenario as resolved. The numbers come from :mod:`sim.report.series`,
as the PNGs' do. Plotly.js is inlined from the ``plotly`` pip package (extra ``html``),
so the file opens without network access. Figures are plain JSON (no plotly Python
objects): fast to build and easy to check.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.errors import UserError
from sim.report import series as data

if TYPE_CHECKING:
    from sim.result import RunData

HTML_CDF_POINTS = 400
"""Points per CDF line in the page (keeps it small; the curve stays smooth)."""
HTML_TIMELINE_BINS = 400
"""Timeline bins across the run in the page (zoom shows them; finer would only add bytes)."""
DASHES = ("solid", "dash", "dashdot", "dot", "longdash", "longdashdot")
"""One Plotly dash pattern per policy, as the PNGs use one line style per policy."""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")  # fmt: skip
CDF_METRICS = ("ttft_s", "tpot_s", "e2e_s")
TIMELINE_PANELS = (
    ("batch", "batch size"), ("kv", "KV used (fraction)"), ("queue", "waiting requests"),
    ("busy", "GPU busy (fraction)"), ("mbu", "MBU (fraction)"), ("mfu", "MFU (fraction)"),
)  # fmt: skip
_INSTALL_HINT = "report.html needs the plotly package: pip install 'batchsim[html]' (or pip install plotly)"


def require_plotly() -> None:
    """Raise UserError (with the install command) when plotly is not installed: call before a long run."""
    _plotly_js()


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UserError(_INSTALL_HINT) from None
    return str(get_plotlyjs())


def write_html(result: RunData, path: Path) -> None:
    """Write :func:`build_html` of ``result`` to ``path``."""
    path.write_text(build_html(result), encoding="utf-8")


def build_html(result: RunData) -> str:
    """The whole page as one string (Plotly.js, figures and styles inline)."""
    from sim.io.scenario import resolved_yaml

    plotly_js = _plotly_js()
    figures = report_figures(result)
    head = f"<title>{html.escape(result.scenario.name)}: batchsim report</title>\n<style>{_CSS}</style>"
    body = [f"<h1>{html.escape(result.scenario.name)}</h1>", f"<p>{html.escape(_facts_line(result))}</p>",
            "<h2>Summary</h2>", summary_table(result.summary)]  # fmt: skip
    if figures:
        body.append("<h2>Latency CDFs</h2><p>Fraction of sent requests; timed-out requests without a value sit "
                    "at the client timeout, rejected ones are not on the curve (see the legend).</p>")
        body += [_figure_block(name) for name in figures if name != "timeline"]
        body.append("<h2>Timeline</h2><p>Time-weighted means per bin (drag to zoom, or use the slider; "
                    "double-click to reset; click a policy in the legend to hide it).</p>")
        body.append(_figure_block("timeline"))
    else:
        body.append("<p>No per-request records (--summary-only): no plots.</p>")
    body += ["<h2>Scenario as resolved</h2>", f"<pre>{html.escape(resolved_yaml(result))}</pre>"]
    scripts = [f'<script type="application/json" id="data-{name}">{_json(f)}</script>' for name, f in figures.items()]
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n{head}\n"
            f"<script>{_ERROR_HOOK}</script>\n<script>{plotly_js}</script>\n</head>\n<body>\n"
            + "\n".join(body + scripts) + f"\n<script>{_RENDER}</script>\n</body>\n</html>\n")  # fmt: skip


def report_figures(result: RunData) -> dict[str, dict[str, Any]]:
    """Plotly figure dicts by name (``ttft_s``, ``tpot_s``, ``e2e_s``, ``timeline``); none without records."""
    if result.requests.empty or result.iterations.empty:
        return {}
    client = result.scenario.client
    timeout_s = client.timeout_s if client else None
    figures = {metric: cdf_figure(result.requests, metric, timeout_s, result.summary) for metric in CDF_METRICS}
    figures["timeline"] = timeline_figure(result)
    return figures


def cdf_figure(requests: Any, metric: str, timeout_s: float | None, summary: Any = None) -> dict[str, Any]:
    """One latency CDF: a line per policy plus its p50/p99 markers, a shaded 90% band where ``summary`` has the
    interval columns; a timeout line when any timed out."""
    traces: list[dict[str, Any]] = []
    cdfs = data.latency_cdfs(requests, metric, timeout_s=timeout_s, points=HTML_CDF_POINTS)
    bands = data.interval_ratios(summary, metric)
    for index, cdf in enumerate(cdfs):
        style = {"color": COLORS[index % len(COLORS)], "dash": DASHES[index % len(DASHES)], "shape": "hv"}
        if cdf.label in bands:
            traces.append(_band_trace(cdf, bands[cdf.label], style["color"]))
        traces.append({"type": "scatter", "mode": "lines", "name": _legend(cdf), "legendgroup": cdf.label,
                       "x": _list(cdf.values_ms), "y": _list(cdf.fractions), "line": style,
                       "hovertemplate": "%{x:.4g} ms: %{y:.3f}<extra>" + html.escape(cdf.label) + "</extra>"})
        marks = [(v, f, s) for v, f, s in ((cdf.p50_ms, 0.5, "circle"), (cdf.p99_ms, 0.99, "triangle-up"))
                 if math.isfinite(v)]  # fmt: skip
        traces.append({"type": "scatter", "mode": "markers", "name": f"{cdf.label} p50/p99", "legendgroup": cdf.label,
                       "showlegend": False, "x": [m[0] for m in marks], "y": [m[1] for m in marks],
                       "marker": {"color": style["color"], "symbol": [m[2] for m in marks], "size": 9}})
    name = data.METRIC_NAMES.get(metric, metric)
    layout: dict[str, Any] = {
        "title": {"text": f"{name} CDF (● p50, ▲ p99{', shaded: 90% interval' if bands else ''})"}, "height": 420,
        "xaxis": {"type": "log", "title": {"text": f"{name} (ms, log scale)"}},
        "yaxis": {"title": {"text": "fraction of sent requests"}, "range": [0, 1.02]},
        "legend": {"orientation": "h", "y": -0.25}, "margin": {"t": 50, "b": 40},
    }  # fmt: skip
    if timeout_s is not None and metric in data.FROM_ARRIVAL and any(c.timed_out_frac for c in cdfs):
        at = math.log10(timeout_s * 1000.0)
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": timeout_s * 1000.0,
                             "x1": timeout_s * 1000.0, "y0": 0, "y1": 1, "line": {"dash": "dot", "color": "grey"}}]
        shares = ", ".join(f"{c.label} {c.timed_out_frac:.1%}" for c in cdfs if c.timed_out_frac)
        layout["annotations"] = [{"x": at, "xref": "x", "y": 0.6, "yref": "y", "xanchor": "right", "showarrow": False,
                                  "text": f"client timeout {timeout_s:g} s<br>timed out: {html.escape(shares)}"}]
    return {"data": traces, "layout": layout}


def _band_trace(cdf: data.CdfSeries, ratios: list[tuple[float, float, float]], color: str) -> dict[str, Any]:
    """A filled polygon around a CDF line: its 90% band (:func:`sim.report.series.cdf_band`)."""
    low, high = data.cdf_band(cdf, ratios)
    return {"type": "scatter", "mode": "none", "name": f"{cdf.label} 90% interval", "legendgroup": cdf.label,
            "showlegend": False, "x": _list(low) + _list(high[::-1]),
            "y": _list(cdf.fractions) + _list(cdf.fractions[::-1]), "fill": "toself", "opacity": 0.2,
            "fillcolor": color, "hoverinfo": "skip"}  # fmt: skip


def timeline_figure(result: RunData) -> dict[str, Any]:
    """Stacked panels sharing one zoomable time axis (range slider below), a line per policy each."""
    iterations = result.iterations
    span_s = float((iterations["start_s"] + iterations["duration_s"]).max() - iterations["start_s"].min())
    bin_s = span_s / HTML_TIMELINE_BINS if span_s > 0 else None
    binned = data.timeline(
        iterations, result.requests, bin_s=bin_s, every=result.iterations_every, replicas=result.replicas_per_policy
    )
    panels = [(key, title) for key, title in TIMELINE_PANELS if any(key in s for s in binned.series.values())]
    slider = {"visible": True, "thickness": 0.05}
    layout: dict[str, Any] = {
        "height": 190 * len(panels) + 120, "hovermode": "x unified", "margin": {"t": 40},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        "xaxis": {"title": {"text": "time (s)"}, "rangeslider": slider, "anchor": f"y{len(panels)}"},
    }  # fmt: skip
    traces = []
    gap = 0.03
    height = (1.0 - gap * (len(panels) - 1)) / len(panels)
    centers = ((binned.edges[:-1] + binned.edges[1:]) / 2).round(4)
    for row, (key, title) in enumerate(panels):
        axis = "y" if row == 0 else f"y{row + 1}"
        top = 1.0 - row * (height + gap)
        layout[f"yaxis{row + 1 if row else ''}"] = {"title": {"text": title}, "domain": [max(top - height, 0.0), top]}
        for index, (label, values) in enumerate(binned.series.items()):
            if key in values:
                traces.append({"type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
                               "showlegend": row == 0, "x": _list(centers), "y": _list(values[key], 5),
                               "xaxis": "x", "yaxis": axis, "line": {"color": COLORS[index % len(COLORS)],
                               "dash": DASHES[index % len(DASHES)], "shape": "hvh"}})  # fmt: skip
    return {"data": traces, "layout": layout}


def summary_table(summary: Any) -> str:
    """The summary as an HTML table, with the cells (units, decimals) of ``summary.md``."""
    from sim.report.tables import summary_cells

    headers, rows, numeric = summary_cells(summary)
    align = ['class="num"' if num else "" for num in numeric]
    head = "".join(f"<th {a}>{html.escape(h)}</th>" for h, a in zip(headers, align, strict=True))
    body = "".join("<tr>" + "".join(f"<td {a}>{html.escape(c)}</td>" for c, a in zip(row, align, strict=True))
                   + "</tr>" for row in rows)  # fmt: skip
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _legend(cdf: data.CdfSeries) -> str:
    return html.escape(data.cdf_legend(cdf))


def _facts_line(result: RunData) -> str:
    facts, scenario = result.facts, result.scenario
    stages = scenario.pipeline_parallel
    pipeline = f" x{stages} pipeline stages" if stages != 1 else ""
    return (f"{facts.get('requests')} requests, seed {result.seed}, {facts.get('model_hf_name')} on "
            f"{scenario.gpu} x{scenario.tensor_parallel}{pipeline} (replicas: {scenario.replicas}), "
            f"cost model: {facts.get('cost_model')}.")  # fmt: skip


def _list(values: np.ndarray, digits: int = 6) -> list[float | None]:
    """Rounded floats for JSON; NaN and infinities as null (Plotly leaves a gap)."""
    return [round(float(v), digits) if math.isfinite(v) else None for v in np.asarray(values, dtype=float)]


def _json(figure: dict[str, Any]) -> str:
    # "</" would end the <script> element early; JSON allows the escaped form.
    return json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _figure_block(name: str) -> str:
    return f'<div class="figure" id="plot-{name}"></div>'


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
table.summary{border-collapse:collapse;font-size:13px;display:block;overflow-x:auto}
table.summary th,table.summary td{border:1px solid #ccc;padding:3px 6px;white-space:nowrap}
table.summary .num{text-align:right} pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
.figure{margin-bottom:1.5em}"""
# Collects script errors so a headless browser (tests) can read them from the DOM.
_ERROR_HOOK = """window.batchsimErrors=[];function batchsimError(m){window.batchsimErrors.push(String(m));
document.documentElement.setAttribute('data-errors',window.batchsimErrors.join(' | '));}
window.addEventListener('error',function(e){batchsimError(e.message);});
window.addEventListener('unhandledrejection',function(e){batchsimError(e.reason);});"""
_RENDER = """(function(){var done=0,blocks=document.querySelectorAll('div.figure');
blocks.forEach(function(div){var name=div.id.slice(5);
var fig=JSON.parse(document.getElementById('data-'+name).textContent);
Plotly.newPlot(div,fig.data,fig.layout,{responsive:true,displaylogo:false}).then(function(){
done+=1;document.documentElement.setAttribute('data-rendered',String(done));});});})();"""
