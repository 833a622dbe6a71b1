"""Every script in `reproductions/` still runs: `--quick` (tiny sizes) over two seeds must finish, print its tables
and write its results file (every seed's figures, where they came from) and its plot. The numbers of a quick run are
not results; each script's own keys are checked."""

import json
import runpy

import pytest
from conftest import REPO_ROOT, require_extra, run_script

# the shared code, and the preparation of the Optimus backbones (a download into OUT_DIR, with no seeds or --quick)
NOT_REPRODUCTIONS = {"common", "optimus_backbones"}
SCRIPTS = sorted(path for path in (REPO_ROOT / "reproductions").glob("*.py") if path.stem not in NOT_REPRODUCTIONS)

pytestmark = pytest.mark.slow  # whole scripts, end to end


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_quick_run_writes_its_figures_and_plot(script, tmp_path, capsys, monkeypatch):
    require_extra("plots", "matplotlib")
    output, plot = tmp_path / "figures.json", tmp_path / "figure.png"
    printed = run_script(script, "--quick", "--seeds", 3, 5, "--threads", 1, "--output", output, "--plot", plot,
                         monkeypatch=monkeypatch, capsys=capsys)
    assert "QUICK smoke run" in printed and "| claim | holds in (seeds) |" in printed
    results = json.loads(output.read_text())
    assert results["quick"] is True and results["seconds"] > 0 and results["seeds"] == [3, 5]
    assert results["script"] == f"reproductions/{script.name}"
    assert results["command"].startswith(f"python reproductions/{script.name} --quick --seeds 3 5")
    assert len(results["commit"]) >= 40 or results["commit"] == "unknown"
    expected = runpy.run_path(str(script))["RESULT_KEYS"]  # the script's own keys (its main() does not run)
    assert [seed["seed"] for seed in results["per_seed"]] == [3, 5]
    for seed in results["per_seed"]:
        assert set(expected) <= set(seed), expected
    assert plot.stat().st_size > 1000
