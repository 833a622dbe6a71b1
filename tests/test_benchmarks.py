"""Every script in `benchmarks/` still runs: `--quick` (tiny sizes, one round) must finish, print its RESULT lines and
write them, with where they came from, to its `--output` results file, from which the docs' tables are made. The
numbers of a quick run are not results; the scripts' own checks (equal greedy tokens, conversions that succeed)
still apply."""

import copy
import importlib
import json
import re
import shlex
from types import ModuleType

import pytest
from conftest import REPO_ROOT, require_extra, run_script

BENCHMARKS = sorted((REPO_ROOT / "benchmarks").glob("bench_*.py"))
EXTRAS = {"bench_onnx": ("onnx", "onnx", "onnxruntime", "onnxscript")}  # script -> (extra, its modules)
RESULT_LINE = re.compile(r"^RESULT (?P<label>.+): (?P<ratio>\d+\.\d+)x "
                         r"\((target [<>]= [\d.]+x: (met|MISSED)|no target); ", re.MULTILINE)

# a results file as the timing functions write it (only what `tables` reads), and the Markdown it gives
SMALL_RESULTS = {
    "ratios": [
        {"label": "step time, new / old", "ratio": 1.04321, "ratio_of_medians": 1.05, "ratio_of_minimums": 0.9876,
         "target": 1.1, "higher_is_better": False, "met": True},
        {"label": "speed-up | new over old", "ratio": 1.5, "ratio_of_medians": 1.5, "ratio_of_minimums": 1.25,
         "target": 2, "higher_is_better": True, "met": False},
        {"label": "for comparison", "ratio": 0.5, "ratio_of_medians": 0.5, "ratio_of_minimums": 0.5, "target": None,
         "higher_is_better": False, "met": None},
    ],
    "timings": {"batch 1 x 8": {"seconds": {"new": [0.2, 0.1, 0.3], "old": [0.25, 0.2]},
                                "load_average_at_end": [1.0, 0.5, 0.25]}},
    "memory": {"checkpoint_bytes": 2**20, "peak_rss": {"conversion": {
        "above_imports_bytes": 1.25 * 2**20, "above_imports_per_checkpoint": 1.25,
        "whole_process_bytes": 3 * 2**20, "whole_process_per_checkpoint": 3.0}}},
    "figures": {"greedy_tokens_equal": {"equal": 520, "total": 520}, "same_tokens": True, "share": 0.0071234,
                "counts": [1, 2], "first_difference": None, "source": "split"},
}
SMALL_TABLES = """\
| result | ratio | target | verdict | ratio of medians | ratio of minimums |
|---|---|---|---|---|---|
| step time, new / old | 1.043x | <= 1.1x | met | 1.050x | 0.988x |
| speed-up \\| new over old | 1.500x | >= 2x | MISSED | 1.500x | 1.250x |
| for comparison | 0.500x |  |  | 0.500x | 0.500x |

**batch 1 x 8** (load average at its end 1.00 0.50 0.25):

| candidate | median (s) | min (s) | runs (s) |
|---|---|---|---|
| new | 0.200 | 0.100 | 0.200, 0.100, 0.300 |
| old | 0.225 | 0.200 | 0.250, 0.200 |

Peak RSS, medians over the rounds; checkpoint 1.0 MiB:

| candidate | above the imports (MiB) | / checkpoint | whole process (MiB) | / checkpoint |
|---|---|---|---|---|
| conversion | 1 | 1.250x | 3 | 3.000x |

- greedy_tokens_equal: {equal: 520, total: 520}
- same_tokens: true
- share: 0.007123
- counts: [1, 2]
- first_difference: null
- source: split"""


def benchmark_module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module of `benchmarks/` (`timing`, a script) imported by name with that folder on `sys.path`, as the scripts
    import `timing`."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    return importlib.import_module(name)


def test_every_benchmark_is_found():
    assert {path.stem for path in BENCHMARKS} >= {"bench_optimus_generation", "bench_optimus_train_step",
                                                  "bench_optimus_conversion", "bench_ernie2_conversion"}


def test_tables_of_a_results_file(monkeypatch):
    timing = benchmark_module("timing", monkeypatch)
    assert timing.tables(SMALL_RESULTS).splitlines() == SMALL_TABLES.splitlines()


def test_a_changed_ratio_changes_the_tables(monkeypatch):
    """A page generated from the results differs from one generated from changed results, so a check that compares
    a page with its results file can fail."""
    timing = benchmark_module("timing", monkeypatch)
    changed = copy.deepcopy(SMALL_RESULTS)
    changed["ratios"][0]["ratio"] = 1.2
    assert timing.tables(changed) != timing.tables(SMALL_RESULTS)
    assert "| step time, new / old | 1.200x | <= 1.1x | met |" in timing.tables(changed)


@pytest.mark.slow  # whole scripts, end to end
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_quick_run(script, capsys, monkeypatch, tmp_path):
    if script.stem in EXTRAS:
        require_extra(*EXTRAS[script.stem])
    output_file = tmp_path / "results.json"
    output = run_script(script, "--quick", "--threads", 1, "--output", output_file, monkeypatch=monkeypatch,
                        capsys=capsys)
    assert "QUICK smoke run" in output
    printed = [(match.group("label"), match.group("ratio")) for match in RESULT_LINE.finditer(output)]
    assert printed, output
    assert f"wrote {output_file}" in output

    results = json.loads(output_file.read_text(encoding="utf-8"))
    shown = script.relative_to(REPO_ROOT).as_posix()
    assert results["script"] == shown
    assert results["command"] == shlex.join(["python", shown, "--quick", "--threads", "1", "--output",
                                             str(output_file)])
    assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?|unknown", results["commit"]), results["commit"]
    assert results["quick"] is True and results["threads"] == 1 and results["repeats"] >= 1
    assert [(row["label"], f"{row['ratio']:.3f}") for row in results["ratios"]] == printed
    assert results["timings"] and results["seconds"] > 0

    # what the docs generator calls: the script's own `tables` if it has one, else timing's
    tables = getattr(benchmark_module(script.stem, monkeypatch), "tables",
                     benchmark_module("timing", monkeypatch).tables)
    markdown = tables(results)
    for label, ratio in printed:
        assert f"| {label} | {ratio}x |" in markdown
