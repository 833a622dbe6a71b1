"""Every script in `benchmarks/` still runs: `--quick` (tiny sizes, one round) must finish and print its RESULT lines.
The numbers of a quick run are not results; the scripts' own checks (equal greedy tokens, conversions that succeed)
still apply."""

import re

import pytest
from conftest import REPO_ROOT, require_extra, run_script

BENCHMARKS = sorted((REPO_ROOT / "benchmarks").glob("bench_*.py"))
EXTRAS = {"bench_onnx": ("onnx", "onnx", "onnxruntime", "onnxscript")}  # script -> (extra, its modules)
RESULT_LINE = re.compile(r"^RESULT .+: \d+\.\d+x \((target [<>]= [\d.]+x: (met|MISSED)|no target); ", re.MULTILINE)

pytestmark = pytest.mark.slow  # whole scripts, end to end


def test_every_benchmark_is_found():
    assert {path.stem for path in BENCHMARKS} >= {"bench_optimus_generation", "bench_optimus_train_step",
                                                  "bench_optimus_conversion", "bench_ernie2_conversion"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_quick_run(script, capsys, monkeypatch):
    if script.stem in EXTRAS:
        require_extra(*EXTRAS[script.stem])
    output = run_script(script, "--quick", "--threads", 1, monkeypatch=monkeypatch, capsys=capsys)
    assert "QUICK smoke run" in output
    assert RESULT_LINE.search(output), output
