"""Reports over summaries: Markdown/terminal tables, the static-vs-continuous speedup
table and matplotlib figures.

Modules: :mod:`sim.report.tables` (``summary_markdown``, ``summary_text``),
:mod:`sim.report.speedup` (``speedup_table``, ``speedup_markdown``),
:mod:`sim.report.speedup_map` (the length class x load x batch size map, measured on the
sweep backends; its text in :mod:`sim.report.speedup_map_text`, heat maps in
:mod:`sim.report.speedup_map_plot`) and
:mod:`sim.report.plots` (figure builders and ``save_figure``; imported on demand
because matplotlib is slow to import). Everything here is a pure function of
DataFrames; only ``save_figure`` writes a file.
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
