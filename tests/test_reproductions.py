"""Every script in `reproductions/` still runs: `--quick` (tiny sizes) must finish, print its table and write its
JSON figures and its plot. The numbers of a quick run are not results; each script's own keys are checked."""

import json
import runpy

import pytest
from conftest import REPO_ROOT, require_extra, run_script

SCRIPTS = sorted(path for path in (REPO_ROOT / "reproductions").glob("*.py") if path.stem != "common")

pytestmark = pytest.mark.slow  # whole scripts, end to end


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_quick_run_writes_its_figures_and_plot(script, tmp_path, capsys, monkeypatch):
    require_extra("plots", "matplotlib")
    output, plot = tmp_path / "figures.json", tmp_path / "figure.png"
    printed = run_script(script, "--quick", "--threads", 1, "--output", output, "--plot", plot,
                         monkeypatch=monkeypatch, capsys=capsys)
    assert "QUICK smoke run" in printed and "| " in printed
    figures = json.loads(output.read_text())
    assert figures["quick"] is True and figures["seconds"] > 0
    expected = runpy.run_path(str(script))["RESULT_KEYS"]  # the script's own keys (its main() does not run)
    assert set(expected) <= set(figures), expected
    assert plot.stat().st_size > 1000
