"""Time and peak memory of writing a large run's records: CSV (batchsim's writer and pandas') vs Parquet.

One simulation (``bench_cli_memory.py``'s scenario: Poisson at 5 req/s, continuous batching,
max batch 64, Llama-2-7B / A100-80GB, about 12 forward passes per request) with
``metrics.max_iteration_rows`` high enough to keep every pass, so ``iterations`` is written in
full. Its ``requests`` and ``iterations`` frames are pickled once; then each (table, format)
is written by a fresh child process that loads the pickle, resets its peak RSS
(``/proc/self/clear_refs``, Linux) and times one writer: batchsim's CSV writer
(:func:`sim.io.csv_writer.write_csv`, the same bytes as pandas), ``DataFrame.to_csv`` with the
CSV float format (what batchsim used before), or :func:`sim.io.parquet.write_frame`. Memory is
the child's peak RSS during the write above its RSS before it (what the write itself costs).

    python benchmarks/bench_parquet.py                     # 100k requests
    python benchmarks/bench_parquet.py --requests 1000000

Measured on a 2-core machine (pyarrow 26, pandas 3.1), seconds / peak MiB above the child's
RSS / file MiB; "CSV" is batchsim's writer, "to_csv" pandas' (the same bytes):

=================================  ==================  ==================  ==================
table (rows)                       CSV                 to_csv              Parquet
=================================  ==================  ==================  ==================
requests, 100k req (100k)          0.38 s / 36 / 12    1.49 s / 4 / 12     0.15 s / 51 / 9
iterations, 100k req (1.2M)        2.64 s / 28 / 88    8.20 s / 5 / 88     0.50 s / 85 / 33
requests, 1M req (1M)              4.74 s / 42 / 124   18.9 s / 5 / 124    0.87 s / 68 / 82
iterations, 1M req (12.0M)         23.8 s / 38 / 876   105 s / 5 / 876     6.05 s / 85 / 316
=================================  ==================  ==================  ==================

batchsim's CSV writer formats 32k rows at a time (a few tens of MiB); pandas writes in small
chunks, so its extra memory is a few MiB; the Parquet writer holds one row group (256k rows) at a
time, so its extra memory stays under ~100 MiB however long the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIO = {
    "name": "bench_parquet",
    "seed": 7,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "policies": [{"name": "continuous", "kind": "continuous", "max_batch_size": 64}],
    "metrics": {"max_iteration_rows": 100_000_000},  # every pass: the full iterations table
}

WRITERS = ("csv", "pandas-csv", "parquet")

# Runs in the child: load one frame, reset the peak RSS, write it, report.
CHILD = """\
import json, sys, time
root, frame_file, fmt, out = sys.argv[1:5]
sys.path.insert(0, root)
import pandas as pd
from sim.io.csv_writer import write_csv
from sim.io.outputs import CSV_FLOAT_FORMAT
from sim.io.parquet import write_frame
frame = pd.read_pickle(frame_file)
if fmt == "parquet":
    import pyarrow.parquet  # noqa: F401 - a one-off import, not the write
def rss_kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
before = rss_kib("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := current RSS
started = time.perf_counter()
if fmt == "csv":
    write_csv(frame, out, CSV_FLOAT_FORMAT)
elif fmt == "pandas-csv":
    frame.to_csv(out, index=False, float_format=CSV_FLOAT_FORMAT)
else:
    write_frame(frame, out)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_mib": (rss_kib("VmHWM:") - before) / 1024, "rows": len(frame)}))
"""


def simulate(requests: int, folder: Path) -> dict[str, Path]:
    """Run the scenario once and pickle its record frames; returns table name -> pickle path."""
    import sim

    scenario = sim.Scenario.model_validate({
        **SCENARIO,
        "workload": {
            "requests": requests,
            "arrival": {"kind": "poisson", "rate": 5.0},
            "prompt_tokens": {"kind": "uniform", "low": 128, "high": 512},
            "output_tokens": {"kind": "uniform", "low": 20, "high": 500},
        },
    })
    started = time.perf_counter()
    result = sim.run(scenario, progress=False)
    print(f"simulated {requests} requests, {len(result.iterations)} passes in {time.perf_counter() - started:.0f}s",
          file=sys.stderr)
    paths = {}
    for table in ("requests", "iterations"):
        paths[table] = folder / f"{table}.pkl"
        getattr(result, table).to_pickle(paths[table])
    return paths


def measure(frame_file: Path, fmt: str, out: Path) -> dict[str, float]:
    """One write in a fresh child; adds the file's size."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(frame_file), fmt, str(out)],
                          capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    report["file_mib"] = out.stat().st_size / 2**20
    out.unlink()
    return report


def main() -> None:
    """Print, per table, seconds, peak MiB and file MiB of CSV and Parquet, and CSV / Parquet ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_parquet-") as tmp:
        folder = Path(tmp)
        frames = simulate(args.requests, folder)
        print("| table | rows | format | write s | peak MiB | file MiB |")
        print("|---|---:|---|---:|---:|---:|")
        ratios = []
        for table, frame_file in frames.items():
            runs = {fmt: measure(frame_file, fmt, folder / f"{table}.{fmt}") for fmt in WRITERS}
            for fmt, r in runs.items():
                print(f"| {table} | {r['rows']:,} | {fmt} | {r['seconds']:.2f} | {r['peak_mib']:.0f} | "
                      f"{r['file_mib']:.0f} |")
            csv, parquet = runs["csv"], runs["parquet"]
            ratios.append(f"{table}: batchsim's CSV writer {runs['pandas-csv']['seconds'] / csv['seconds']:.1f}x "
                          f"faster than pandas' to_csv; Parquet {csv['seconds'] / parquet['seconds']:.1f}x faster "
                          "than that, "
                          f"peak {csv['peak_mib']:.0f} vs {parquet['peak_mib']:.0f} MiB, "
                          f"file {csv['file_mib'] / parquet['file_mib']:.1f}x smaller")
        print("\n".join(ratios))


if __name__ == "__main__":
    main()
