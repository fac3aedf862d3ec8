"""Reports over results, as pure functions: Markdown/terminal tables, the static-vs-continuous
speedup table, matplotlib figures, the HTML page and Chrome/Perfetto trace events.

Modules: :mod:`sim.report.tables` (``summary_markdown``, ``summary_text``),
:mod:`sim.report.speedup` (``speedup_table``, ``speedup_markdown``), :mod:`sim.report.plots`
(figure builders and ``save_figure``; imported on demand because matplotlib is slow to
import), :mod:`sim.report.series` (the time series the plots draw), :mod:`sim.report.html`
and :mod:`sim.report.trace_events`. Nothing here simulates; the simulations behind
``results/`` are :mod:`sim.studies`. Only ``save_figure`` and ``write_html`` write a file.
"""

from sim.report.speedup import SPEEDUP_COLUMNS, speedup_markdown, speedup_table
from sim.report.tables import summary_markdown, summary_text

__all__ = [
    "SPEEDUP_COLUMNS",
    "speedup_markdown",
    "speedup_table",
    "summary_markdown",
    "summary_text",
]
