"""``python -m sim``: run, validate, inspect, calibrate, report, traces, sweep, capacity.

Every user mistake surfaces as one ``error: ...`` line on stderr and exit code 2; the
subcommands are thin: they parse arguments, call the library, and print or write.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from sim.errors import MAX_LINE_CHARS, UserError, one_line

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIO = REPO_ROOT / "scenarios" / "quickstart.yaml"

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"give a command: {', '.join(_commands(parser))}")
    try:
        return handler(args)
    except UserError as exc:
        print(one_line(f"error: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose misuse errors are one line, as every other batchsim error.

    argparse prints the whole usage block before its message; here the message and where to
    find the usage, then exit code 2. Subcommand parsers are of this class too (add_subparsers
    makes them of the parser's own class).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Which (sub)command was parsed last, so that "unrecognized arguments", which argparse
        # reports from the top-level parser, can point at that command's --help.
        self.set_defaults(_help_prog=self.prog)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but unrecognized arguments name the subcommand whose --help lists the right ones."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._fail(f"unrecognized arguments: {' '.join(extras)}", getattr(parsed, "_help_prog", self.prog))
        return parsed

    def error(self, message: str) -> NoReturn:
        """Print ``error: <message> (see <prog> --help)`` on stderr and exit with code 2."""
        self._fail(message, self.prog)

    def _fail(self, message: str, prog: str) -> NoReturn:
        see = f" (see {prog} --help)"
        self.exit(2, one_line(f"error: {message}", MAX_LINE_CHARS - len(see)) + see + "\n")


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(actions[0].choices) if actions else []


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every subcommand."""
    from sim.version import __version__

    parser = OneLineParser(prog="python -m sim", description="batchsim: LLM inference batching simulator")
    parser.add_argument("--version", action="version", version=f"batchsim {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_run(sub)
    _add_validate(sub)
    _add_schema(sub)
    _add_list(sub)
    _add_report(sub)
    _add_traces(sub)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: argparse._SubParsersAction) -> None:
    from sim.calibration import calibrate_cli

    calibrate_cli.add_parser(sub)
    sub.choices["calibrate"].set_defaults(handler=calibrate_cli.run)
    from sim.validation import cli as validation_cli
    validation_cli.add_parser(sub)
    from sim.parity import cli as parity_cli

    parity_cli.add_parser(sub)
    from sim.calibration import serving_cli

    serving_cli.add_parser(sub)
    try:
        from sim.sweeps import cli as sweep_cli
    except ImportError:  # sweeps are optional until the sweep package lands
        return
    sweep_cli.add_parsers(sub)


def _scenario_args(p: argparse.ArgumentParser, *, optional_file: bool = False) -> None:
    if optional_file:
        p.add_argument("file", nargs="?", default=str(DEFAULT_SCENARIO), help="scenario YAML (default: quickstart)")
    else:
        p.add_argument("file", help="scenario YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field by dotted path, e.g. workload.arrival.rate=4 (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario seed")


def load_from_args(args: argparse.Namespace):  # noqa: ANN201 - returns sim.config.Scenario
    """Load the scenario named on the command line with its --set/--seed overrides."""
    from sim.io.scenario import load_scenario, parse_set_options

    overrides = parse_set_options(args.overrides)
    if args.seed is not None:
        if args.seed < 0:
            raise UserError(f"--seed = {args.seed}: must be >= 0")
        overrides["seed"] = args.seed
    return load_scenario(args.file, overrides)


# --------------------------------------------------------------------------- run
def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate a scenario and write tables and plots")
    _scenario_args(p, optional_file=True)
    p.add_argument("--out", default=None,
                   help="output folder (default: results/<name>/); replaced only if empty or written by batchsim")
    p.add_argument("--policy", action="append", default=None, metavar="NAME", help="run only this policy (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--summary-only", action="store_true",
                   help="keep and write only the summary (one policy's records in memory at a time; no "
                        "requests.csv, iterations.csv or plots): for runs of millions of requests")
    p.add_argument("--trace-events", action="store_true",
                   help="also write trace.json: every forward pass and request as a Chrome trace-event file "
                        "(open in ui.perfetto.dev)")
    p.add_argument("--json", action="store_true",
                   help="also write benchmark.json: per policy, the figures under vLLM benchmark_serving's result keys "
                        "(mean_ttft_ms, p99_itl_ms, output_throughput, ...; percentiles from metrics.percentiles)")
    p.add_argument("--html", action="store_true", help="also write report.html: one self-contained interactive "
                   "page (summary, latency CDFs, timeline, scenario); needs plotly (pip install 'batchsim[html]')")
    p.add_argument("--format", choices=("csv", "parquet"), default=None,
                   help="file format of the request and iteration records (overrides metrics.format, default csv); "
                        "parquet writes requests.parquet and iterations.parquet, needs pyarrow "
                        "(pip install 'batchsim[parquet]')")
    p.add_argument("--replicates", type=int, default=1, metavar="K",
                   help="run the scenario under K seeds (the scenario's and K-1 derived from it): each headline "
                        "figure becomes their mean and its _lo/_hi interval narrows with K (default 1: the "
                        "sampling error of one run's requests; docs/uncertainty.md)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors; no progress bar")
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Check the output folder, simulate, print the summary table, write the output folder."""
    from sim.io.outputs import check_output_dir
    from sim.io.parquet import require_pyarrow, wants_parquet
    from sim.report.tables import summary_text
    from sim.runner import run
    from sim.uncertainty.replicates import check_replicates

    check_replicates(args.replicates)  # before anything runs
    if args.trace_events and args.summary_only:
        raise UserError("--trace-events needs the per-pass records that --summary-only drops; give one of them",
                        field="trace-events")
    if args.format:  # last, so it wins over a --set of the same field; recorded in scenario.resolved.yaml
        args.overrides = [*args.overrides, f"metrics.format={args.format}"]
    scenario = load_from_args(args)
    out_dir = Path(args.out) if args.out else Path("results") / scenario.name
    check_output_dir(out_dir)  # before simulating: a bad --out must not cost a long run
    if wants_parquet(scenario, summary_only=args.summary_only):
        require_pyarrow()
    if args.html:
        from sim.report.html import require_plotly

        require_plotly()
    # What is loaded by now lives until exit: spare the per-policy collections (runner) scanning it.
    gc.freeze()
    with warnings_as_lines():
        result = run(scenario, policies=args.policy, progress=not args.quiet, summary_only=args.summary_only,
                     replicates=args.replicates)
    result.save(out_dir, plots=not args.no_plots, trace_events=args.trace_events, json=args.json, html=args.html)
    if not args.quiet:
        from sim.io.outputs import deployment_text

        facts = result.facts
        where = deployment_text(scenario.gpu, scenario.tensor_parallel, scenario.replicas, scenario.pipeline_parallel)
        print(f"{scenario.name}: {facts['requests']} requests, {facts['model_hf_name']} on {where}, "
              f"cost model {facts['cost_model']}, simulated in {result.runtime_s:.1f}s")
        print(summary_text(result.summary))
        from sim.uncertainty.flags import flag_lines

        for line in flag_lines(result.summary):
            print(line)
        print(f"wrote {out_dir}/")
    return 0


@contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Inside, each UserWarning is one ``warning: ...`` line on stderr, printed when it is raised.

    At once, not collected and printed at the end: the size estimate ``run`` gives before a
    large run is only of use before the minutes it warns about (an empty warm-up window is
    said after the run anyway, since it is found then).
    """

    def print_line(message: Warning | str, *_: object, **__: object) -> None:
        print(f"warning: {message}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = print_line
        yield


# --------------------------------------------------------------------------- validate / schema / list
def _add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a scenario file (and that its model fits) without running it")
    _scenario_args(p)
    p.set_defaults(handler=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate the schema and resolve hardware, memory and workload."""
    from sim.resolve import resolve
    from sim.runner import check_servable

    scenario = load_from_args(args)
    resolved = resolve(scenario)
    check_servable(resolved, scenario.policies)
    facts = resolved.facts()
    print(f"{args.file}: ok — {len(scenario.policies)} policies, {facts['requests']} requests, "
          f"KV {facts['kv_blocks_per_replica']} blocks/replica, cost model {facts['cost_model']}")
    return 0


def _add_schema(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the scenario JSON Schema (for editor completion)")
    p.add_argument("--markdown", action="store_true", help="print the field reference as Markdown instead")
    p.set_defaults(handler=cmd_schema)


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema of the scenario file."""
    from sim.config import Scenario
    from sim.schema_doc import schema_markdown

    print(schema_markdown() if args.markdown else json.dumps(Scenario.model_json_schema(), indent=2))
    return 0


CATALOGS = ("models", "gpus", "policies", "presets", "arrivals", "lengths", "traces")
"""What ``list`` shows (sim.listing renders each; named here so ``--help`` imports nothing heavy)."""


def _add_list(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help=f"list one catalog: {', '.join(CATALOGS)}")
    p.add_argument("what", choices=CATALOGS)
    p.set_defaults(handler=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    """Print one catalog."""
    from sim.listing import catalog_lines

    for line in catalog_lines(args.what):
        print(line)
    return 0


# --------------------------------------------------------------------------- report / traces
def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="regenerate results/ from the shipped scenarios")
    p.add_argument("--scenarios", default=str(REPO_ROOT / "scenarios"), help="folder of scenario YAMLs")
    p.add_argument("--out", default="results", help="results folder")
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots")
    p.add_argument("--html", action="store_true", help="also write each scenario's report.html (needs plotly)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Run every shipped scenario and write results/ plus the batching speedup table."""
    from sim.studies.regenerate import regenerate_results

    if args.html:
        from sim.report.html import require_plotly

        require_plotly()
    regenerate_results(Path(args.scenarios), Path(args.out), plots=not args.no_plots,
                       progress=not args.quiet, log=print, html=args.html)
    return 0


def _add_traces(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("traces", help="fetch or convert public request traces")
    tsub = p.add_subparsers(title="traces commands", metavar="ACTION")
    fetch = tsub.add_parser("fetch", help="download a registered trace into the cache and convert it")
    fetch.add_argument("name", help="registered trace name (python -m sim list traces)")
    fetch.add_argument("--cache-dir", default=None, help="where to keep it (default: ~/.cache/batchsim/traces)")
    fetch.set_defaults(handler=cmd_traces_fetch)
    convert = tsub.add_parser("convert", help="convert an AzurePublicDataset LLM trace CSV to batchsim columns")
    convert.add_argument("src")
    convert.add_argument("dst")
    convert.set_defaults(handler=cmd_traces_convert)
    p.set_defaults(handler=lambda a: p.error(f"give an action: {', '.join(_commands(p))}"))


def cmd_traces_fetch(args: argparse.Namespace) -> int:
    """Download and convert a registered public trace."""
    from sim.workload.traces import fetch_trace

    path = fetch_trace(args.name, Path(args.cache_dir) if args.cache_dir else None)
    print(f"{args.name}: {path}")
    return 0


def cmd_traces_convert(args: argparse.Namespace) -> int:
    """Convert a local AzurePublicDataset CSV (DST is checked before SRC is read; only a new path or a
    regular file is replaced)."""
    from sim.io.safe_paths import check_target, require_input_file
    from sim.workload.traces import convert_azure_trace

    src = require_input_file(args.src, "trace file", field="src")
    check_target(args.dst, field="dst")
    rows = convert_azure_trace(src, Path(args.dst))
    print(f"wrote {rows} requests to {args.dst}")
    return 0
