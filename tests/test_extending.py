"""docs/extending.md's promise: a new batching policy is its own file and one table row.

The worked example is taken from the page itself, dropped into a copy of the package with one
row added to ``sim/policies/table.py``, and run as a scenario ``kind``: nothing else is edited.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _example() -> str:
    page = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    return next(block for block in blocks if block.startswith("# sim/policies/shortest_first.py"))


def test_a_new_policy_needs_its_own_file_and_one_table_row(tmp_path: Path) -> None:
    package = tmp_path / "sim"
    shutil.copytree(ROOT / "sim", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "policies" / "shortest_first.py").write_text(_example())
    table = package / "policies" / "table.py"
    text = table.read_text()
    static = "from sim.policies.static import StaticPolicy\n"
    text = text.replace(static, "from sim.policies.shortest_first import ShortestFirstPolicy\n" + static)
    row = '    "chunked_prefill": ChunkedPrefillPolicy,\n'
    text = text.replace(row, row + '    "shortest_first": ShortestFirstPolicy,\n')
    table.write_text(text)
    script = """
import sim
from sim.config import Scenario
scenario = Scenario.from_data({
    "name": "ext", "model": "llama-2-7b", "gpu": "a100-80gb",
    "workload": {"requests": 30, "arrival": {"kind": "burst"},
                 "prompt_tokens": {"kind": "uniform", "low": 10, "high": 900},
                 "output_tokens": {"kind": "fixed", "value": 20}},
    "policies": [{"name": "short", "kind": "shortest_first", "max_batch_size": 4},
                 {"name": "fifo", "kind": "continuous", "max_batch_size": 4}],
})
result = sim.run(scenario)
rows = result.summary.set_index("policy")
assert (rows["completed"] == 30).all()
requests = result.requests
short = requests[requests["policy"] == "short"].sort_values("first_scheduled_s")
# Shortest prompt first: the first batch holds the four shortest prompts of the burst.
first = short.head(4)["prompt_tokens"].max()
assert first <= requests[requests["policy"] == "short"]["prompt_tokens"].nsmallest(4).max()
print(rows.loc["short", "ttft_p50_s"] < rows.loc["fifo", "ttft_p50_s"])
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"  # short prompts first: a lower median TTFT on this burst
