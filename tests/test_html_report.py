"""report.html: self-contained (no network), plot JSON well formed, and rendered without JS errors
in headless Chromium for every shipped scenario (skipped, with the reason, when no browser is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="report.html needs plotly (pip install 'batchsim[html]')")

from sim.cli import main  # noqa: E402
from sim.errors import MissingDataError  # noqa: E402
from sim.io.scenario import load_scenario  # noqa: E402
from sim.report.html import CDF_METRICS, build_html  # noqa: E402
from sim.runner import run  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SHIPPED = sorted(SCENARIOS.rglob("*.yaml"))
REQUESTS = 60  # enough for every panel; keeps the whole set a few seconds
_DATA = re.compile(r'<script type="application/json" id="data-([a-z_0-9]+)">(.*?)</script>', re.S)


def browser() -> str | None:
    """A Chromium binary on PATH (Debian: apt-get install chromium), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """report.html of every shipped scenario at REQUESTS requests (scenarios needing absent data left out)."""
    folder = tmp_path_factory.mktemp("html")
    out = {}
    for path in SHIPPED:
        try:
            result = run(load_scenario(path, {"workload.requests": REQUESTS}), progress=False)
        except MissingDataError:
            continue
        page = folder / f"{path.stem}.html"
        page.write_text(build_html(result), encoding="utf-8")
        out[path.stem] = (page, result)
    assert "quickstart" in out and "overload" in out
    return out


def figures(page: Path) -> dict[str, dict]:
    return {name: json.loads(text.replace("<\\/", "</")) for name, text in _DATA.findall(page.read_text())}


def test_self_contained_and_small_enough(reports):
    for page, _ in reports.values():
        text = page.read_text()
        assert not re.search(r"<script[^>]+src=|<link[^>]+href=[\"']https?:", text), page.name
        assert "Plotly" in text and "newPlot" in text
        assert page.stat().st_size < 8_000_000  # the inlined plotly.min.js is most of it


def test_figures_parse_and_hold_a_trace_per_policy(reports):
    for page, result in reports.values():
        figs = figures(page)
        assert sorted(figs) == sorted([*CDF_METRICS, "timeline"]), page.name
        policies = [str(p) for p in result.summary["policy"]]
        for metric in CDF_METRICS:
            lines = [t for t in figs[metric]["data"] if t["mode"] == "lines"]
            assert [t["legendgroup"] for t in lines] == policies
            assert figs[metric]["layout"]["xaxis"]["type"] == "log"
            assert "(ms" in figs[metric]["layout"]["xaxis"]["title"]["text"]
        timeline = figs["timeline"]
        assert timeline["layout"]["xaxis"]["rangeslider"]["visible"]
        shown = [t["name"] for t in timeline["data"] if t["showlegend"]]
        assert shown == policies
        assert "<table class=\"summary\">" in page.read_text() and "batchsim_version" in page.read_text()


def test_overload_marks_the_timeout(reports):
    page, result = reports["overload"]
    if not (result.requests["status"] == "timed_out").any():
        pytest.skip("no request timed out at this request count")
    layout = figures(page)["e2e_s"]["layout"]
    assert layout["shapes"][0]["x0"] == result.scenario.client.timeout_s * 1000
    assert "timed out" in layout["annotations"][0]["text"]


def test_cli_run_html_writes_report(tmp_path):
    out = tmp_path / "run"
    args = ["run", str(SCENARIOS / "quickstart.yaml"), "--set", f"workload.requests={REQUESTS}", "--out", str(out),
            "--html", "--no-plots", "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert (out / "report.html").is_file() and not (out / "ttft_cdf.png").exists()
    assert main(args) == 0  # a folder holding report.html is still batchsim's, so it is replaced


@pytest.mark.parametrize("name", [p.stem for p in SHIPPED])
def test_renders_in_headless_chromium(reports, name):
    binary = browser()
    if binary is None:
        pytest.skip("no Chromium on PATH (Debian/Ubuntu: apt-get install chromium); structure tested above")
    if name not in reports:
        pytest.skip(f"{name}: needs data not present here (MissingDataError)")
    page, _ = reports[name]
    dom = _dump_dom(binary, page)
    root = re.search(r"<html[^>]*>", dom)
    assert root is not None and "data-errors" not in root.group(0), root  # the page's error hook saw none
    assert 'data-rendered="4"' in root.group(0)  # every Plotly.newPlot promise resolved
    assert dom.count('class="plot-container plotly"') == 4
    assert dom.count('class="main-svg"') >= 4


def _dump_dom(binary: str, page: Path) -> str:
    command = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=20000",
               "--dump-dom", page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_chromium_check_catches_a_js_error(reports, tmp_path):
    binary = browser()
    if binary is None:
        pytest.skip("no Chromium on PATH (Debian/Ubuntu: apt-get install chromium)")
    broken = tmp_path / "broken.html"
    text = reports["quickstart"][0].read_text()
    broken.write_text(text.replace("</body>", "<script>undefinedCall();</script></body>"))
    root = re.search(r"<html[^>]*>", _dump_dom(binary, broken))
    assert root is not None and "undefinedCall" in root.group(0)
