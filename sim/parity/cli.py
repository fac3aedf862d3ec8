"""``python -m sim parity``: record vLLM's schedule, diff batchsim's against it, write the report.

* ``parity record SCENARIO --out TRACE.json``: vLLM's scheduler on the scenario's requests
  (needs vLLM: ``pip install 'batchsim[parity]'``).
* ``parity diff TRACE.json [...]``: batchsim's preset on the trace's arrivals, compared step by
  step (no vLLM needed); ``--report FILE`` writes the markdown.
* ``parity run SCENARIO [...] --out DIR``: both, for every vLLM-preset policy of every scenario
  named, writing ``DIR/<vLLM version>.md`` (``--traces DIR2``: the recorded traces too).

``record`` and ``run`` give the scenario's vLLM-preset policies the preset of the installed vLLM
(0.11.x: ``vllm-0.11``, 0.15.x: ``vllm-0.15``), so one scenario serves every version.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.errors import UserError
from sim.io.safe_write import write_text

DEFAULT_OUT = Path("results") / "parity"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``parity`` and its actions on the ``python -m sim`` subcommands."""
    p = sub.add_parser("parity", help="compare batchsim's vLLM presets with vLLM's own scheduler, step by step")
    actions = p.add_subparsers(title="parity actions", metavar="ACTION")
    rec = actions.add_parser("record", help="record vLLM's schedule of a scenario's requests (needs vLLM)")
    _scenario_options(rec)
    rec.add_argument("--out", required=True, help="trace file to write (JSON)")
    lag_help = "drive vLLM's AsyncScheduler with a one-step output lag (default: as the preset)"
    rec.add_argument("--async-scheduling", choices=("preset", "on", "off"), default="preset", help=lag_help)
    rec.set_defaults(handler=cmd_record)
    diff = actions.add_parser("diff", help="replay a recorded trace in batchsim and compare (no vLLM needed)")
    diff.add_argument("traces", nargs="+", help="trace files (JSON, format batchsim-parity/1)")
    diff.add_argument("--report", default=None, help="write the markdown report here")
    diff.set_defaults(handler=cmd_diff)
    run = actions.add_parser("run", help="record and compare every scenario; write DIR/<vLLM version>.md")
    run.add_argument("files", nargs="+", help="scenario YAML files, each with one vLLM V1 preset policy")
    run.add_argument("--policy", default=None, help="the policy to compare (when a scenario has several)")
    run.add_argument("--out", default=str(DEFAULT_OUT), help=f"report folder (default: {DEFAULT_OUT})")
    run.add_argument("--traces", default=None, help="also write the recorded traces into this folder")
    run.set_defaults(handler=cmd_run)
    p.set_defaults(handler=lambda args: p.error("choose an action: record, diff or run"))


def _scenario_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="scenario YAML with one vLLM V1 preset policy")
    p.add_argument("--policy", default=None, help="the policy to compare (when the scenario has several)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field by dotted path (repeatable)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="override the scenario seed")


def _load(file: str, overrides: list[str], seed: int | None):  # noqa: ANN202 - sim.config.Scenario, lazily
    """The scenario with its ``--set`` lines and ``--seed`` (as ``run`` reads them)."""
    from sim.io.scenario import load_scenario, parse_set_options

    values = parse_set_options(overrides)
    if seed is not None:
        if seed < 0:
            raise UserError(f"--seed = {seed}: must be >= 0", field="seed")
        values["seed"] = seed
    return load_scenario(file, values)


def installed_preset_overrides(scenario_file: str, installed: str) -> list[str]:
    """``--set`` lines that give every vLLM-preset policy of the scenario the installed version's preset."""
    from sim.io.scenario import load_scenario
    from sim.parity.vllm_driver import preset_for_version

    preset = preset_for_version(installed)
    if preset is None:  # a version the presets do not model: keep what the scenario says
        return []
    policies = load_scenario(scenario_file).policies
    return [f"policies[{p.name}].preset={preset}" for p in policies if str(p.preset or "").startswith("vllm-")]


def _record(file: str, policy: str | None, overrides: list[str], seed: int | None, lag: str = "preset"):  # noqa: ANN202
    from sim.parity.inputs import cost_model_for, inputs_from_scenario
    from sim.parity.vllm_driver import import_vllm, record

    vllm = import_vllm()  # say so before resolving anything when vLLM is missing
    overrides = installed_preset_overrides(file, vllm.__version__) + list(overrides)
    scenario = _load(file, overrides, seed)
    inputs = inputs_from_scenario(scenario, policy)
    if lag != "preset":
        inputs.scheduler["async_scheduling"] = lag == "on"
    return record(inputs.requests, inputs.deployment, inputs.scheduler, cost_model_for(inputs.deployment))


def cmd_record(args: argparse.Namespace) -> int:
    """Record one trace."""
    trace = _record(args.file, args.policy, args.overrides, args.seed, args.async_scheduling)
    trace.write(Path(args.out))
    print(f"wrote {args.out}: vLLM {trace.engine['version']}, {len(trace.steps)} steps")
    return 0


def _compare(trace):  # noqa: ANN001, ANN202
    from sim.parity.diff import compare
    from sim.parity.inputs import cost_model_for
    from sim.parity.replay import replay

    return compare(trace.steps, replay(trace), trace.requests, cost_model_for(trace.deployment))


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare each trace with batchsim's replay; print the summary, write the report if asked."""
    from sim.parity.report import markdown, summary_lines
    from sim.parity.trace import read_trace

    rows = []
    for path in args.traces:
        trace = read_trace(Path(path))
        comparison = _compare(trace)
        print("\n".join([f"{path}:", *summary_lines(trace, comparison)]))
        rows.append((Path(path).stem, trace, comparison))
    if args.report:
        write_text(args.report, markdown(rows, "python -m sim parity diff " + " ".join(args.traces)), field="report")
        print(f"wrote {args.report}")
    return 0


def _recordings(file: str, name: str) -> list:  # noqa: ANN202 - ScheduleTrace, imported lazily
    """The synchronous recording, and the async one too when the preset schedules asynchronously."""
    synchronous = _record(file, name, [], None, "off")
    if not _record_preset_async(file, name):
        return [synchronous]
    return [synchronous, _record(file, name, [], None, "on")]


def _record_preset_async(file: str, name: str) -> bool:
    from sim.parity.inputs import inputs_from_scenario
    from sim.parity.vllm_driver import import_vllm

    overrides = installed_preset_overrides(file, import_vllm().__version__)
    scenario = _load(file, overrides, None)
    return bool(inputs_from_scenario(scenario, name).scheduler["async_scheduling"])


def cmd_run(args: argparse.Namespace) -> int:
    """Record every vLLM-preset policy of every scenario with the installed vLLM, compare, write
    DIR/<version>.md (and the traces, with --traces)."""
    from sim.io.scenario import load_scenario
    from sim.parity.report import markdown, summary_lines

    out = Path(args.out)
    rows = []
    for file in args.files:
        names = [p.name for p in load_scenario(file).policies if str(p.preset or "").startswith("vllm-")]
        for name in [args.policy] if args.policy else names:
            for trace in _recordings(file, name):
                lagged = trace.scheduler.get("async_scheduling")
                label = f"{Path(file).stem} / {name}" + (" / async scheduling" if lagged else "")
                if args.traces:
                    suffix = "-async" if lagged else ""
                    stem = f"vllm-{trace.engine['version']}-{Path(file).stem}-{name}{suffix}"
                    trace.write(Path(args.traces) / f"{stem}.json")
                comparison = _compare(trace)
                print("\n".join([f"{label}:", *summary_lines(trace, comparison)]))
                rows.append((label, trace, comparison))
    if not rows:
        raise UserError("no policy with a vLLM preset in the scenarios given", field="files")
    version = rows[0][1].engine["version"]
    report = write_text(out / f"{version}.md", markdown(rows, "python -m sim parity run " + " ".join(args.files)))
    print(f"wrote {report}")
    return 0
