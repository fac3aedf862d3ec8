"""Reports over summaries: Markdown/terminal tables, the static-vs-continuous speedup
table and matplotlib figures.

Modules: :mod:`sim.report.tables` (``summary_markdown``, ``summary_text``),
:mod:`sim.report.speedup` (``speedup_table``, ``speedup_markdown``) and
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
