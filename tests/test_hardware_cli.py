"""``calibrate`` subcommand: writes the committed calibration again, plus a fit report."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sim.calibration import calibrate_cli
from sim.errors import UserError
from sim.hardware.calibration_files import CALIBRATION_DIR, read_yaml

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
needs_shared = pytest.mark.skipif(
    not (PROFILES / "a100").is_dir(),
    reason=f"raw A100 profiles not found at {PROFILES} (../shared next to the repo)",
)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sim")
    calibrate_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["calibrate", *argv])


@needs_shared
def test_calibrate_with_report_writes_yaml_markdown_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "phi2.yaml"
    code = calibrate_cli.run(
        _parse(
            [
                "--profiles",
                str(PROFILES),
                "--model",
                "phi-2",
                "--gpu",
                "a100-80gb",
                "--tp",
                "1",
                "--out",
                str(out),
                "--report",
                "--report-dir",
                str(tmp_path),
            ]
        )
    )
    assert code == 0
    assert read_yaml(out) == read_yaml(CALIBRATION_DIR / "phi-2_a100-80gb_tp1.yaml")
    md, png = tmp_path / "phi-2_a100-80gb_tp1_fit.md", tmp_path / "phi-2_a100-80gb_tp1_fit.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert (
        "| linear |" in printed and "MAPE" in printed and "| attention_decode |" in md.read_text()
    )


def test_model_is_required_without_all() -> None:
    with pytest.raises(UserError, match="--model"):
        calibrate_cli.run(_parse(["--profiles", "/nonexistent"]))


def test_missing_profiles_folder_is_reported(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="profile file not found"):
        calibrate_cli.run(
            _parse(
                [
                    "--profiles",
                    str(tmp_path),
                    "--model",
                    "llama-2-7b",
                    "--out",
                    str(tmp_path / "x.yaml"),
                ]
            )
        )
    assert not (tmp_path / "x.yaml").exists()


@needs_shared
def test_tp_without_profile_rows_is_reported(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no TP2 rows"):
        calibrate_cli.run(
            _parse(
                [
                    "--profiles",
                    str(PROFILES),
                    "--model",
                    "phi-2",
                    "--tp",
                    "2",
                    "--out",
                    str(tmp_path / "x.yaml"),
                ]
            )
        )
