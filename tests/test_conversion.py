"""The comparison every converter's `--reference` check goes through (`hf_ext.conversion`): tolerances per output,
shapes, NaN and infinities, exact integer outputs, the failure naming the worst output; and the tolerances each
converter states, against the reliability page's table (each model's conversion tests check them against its
fixture's). Each converter's failure on a shifted reference is in tests/test_bad_input.py's table."""

import math
from pathlib import Path

import pytest
import torch

from hf_ext.conversion import (
    EXACT,
    Compared,
    ParityCheck,
    Tolerance,
    compare_output,
    compare_with_reference,
    exact_check,
    print_parity,
    require_parity,
)
from hf_ext.errors import HfExtError
from hf_ext.models import MODELS

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY = ROOT / "docs" / "reliability.md"


def compare(ours, expected, tolerance=Tolerance(atol=1e-5)):
    """`compare_output` of two tensors (lists become float64 tensors, so that the differences are the ones written)."""
    def tensor(values):
        return values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.float64)

    return compare_output("out", tensor(ours), tensor(expected), tolerance, "r.safetensors")


def test_within_and_beyond_an_absolute_tolerance():
    inside = compare([1.0, 2.0 + 0.9e-5], [1.0, 2.0])
    assert inside.passed and inside.error == pytest.approx(0.9e-5, rel=1e-6)
    outside = compare([1.0, 2.0 + 1.1e-5], [1.0, 2.0])
    assert not outside.passed and outside.excess == pytest.approx(1.1, rel=1e-6)


def test_the_relative_term_scales_with_the_original():
    tolerance = Tolerance(atol=1e-5, rtol=1e-4)
    assert compare([1000.09], [1000.0], tolerance).passed  # allowed there: 1e-5 + 0.1
    assert not compare([1.0 + 2e-4], [1.0], tolerance).passed  # allowed there: 1.1e-4
    assert str(tolerance) == "atol 1e-05, rtol 0.0001"


def test_integer_outputs_and_exact_tolerances_allow_no_difference():
    counts = compare(torch.tensor([3, 4]), torch.tensor([3, 5]), Tolerance(atol=10.0))
    assert not counts.passed and counts.tolerance == EXACT and str(counts.tolerance) == "exact"
    assert compare(torch.tensor([3, 4]), torch.tensor([3, 4]), Tolerance(atol=10.0)).passed
    assert not compare([2.0 + 1e-7], [2.0], EXACT).passed
    assert compare([2.0], [2.0], EXACT).passed
    assert exact_check("weights (round trip)", 0.0).passed and not exact_check("weights (round trip)", 1e-9).passed


def test_shapes_must_agree():
    with pytest.raises(HfExtError, match=r"r.safetensors: out has shape \[3\], the converted model gives \[2\]"):
        compare([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(HfExtError, match="has shape"):
        compare([[1.0, 2.0]], [1.0, 2.0])  # no broadcasting


def test_nan_and_infinities():
    with pytest.raises(HfExtError, match="out holds NaN values"):
        compare([1.0], [math.nan])
    with pytest.raises(HfExtError, match="out holds infinite values"):
        compare([-math.inf], [-math.inf])
    masked = Tolerance(atol=1e-5, infinities=True)
    assert compare([-math.inf, 1.0], [-math.inf, 1.0], masked).passed
    moved = compare([1.0, -math.inf], [-math.inf, 1.0], masked)
    assert not moved.passed and moved.error == math.inf
    assert not compare([math.inf], [-math.inf], masked).passed
    undefined = compare([math.nan, 1.0], [1.0, 1.0])  # the converted model gives NaN
    assert not undefined.passed and math.isnan(undefined.error)
    assert not compare([math.inf], [1.0]).passed


def test_a_failure_names_the_worst_output_and_counts_the_others():
    checks = [ParityCheck("a", 2e-5, Tolerance(atol=1e-5), 2.0), ParityCheck("b", 5.0, Tolerance(atol=1e-5), 5e5),
              ParityCheck("c", 0.0, EXACT, 0.0)]
    with pytest.raises(HfExtError) as failure:
        require_parity(checks, "r.safetensors")
    assert str(failure.value) == ("the converted model fails its parity check against r.safetensors: b: max abs error "
                                  "5 exceeds its tolerance (atol 1e-05) (1 more beyond their tolerance); nothing was "
                                  "written")
    require_parity([checks[2]], "r.safetensors")


def test_a_passing_run_prints_each_error_with_its_tolerance(capsys):
    print_parity([exact_check("weights (round trip)", 0.0), compare([1.0 + 3e-6], [1.0])])
    assert capsys.readouterr().out == ("weights (round trip): max abs error 0 (tolerance: exact)\n"
                                       "out: max abs error 3e-06 (tolerance: atol 1e-05)\n")


def test_a_reference_of_another_model_is_refused():
    def outputs(model, reference):
        return {"y": Compared(reference["x"], reference["y"], EXACT)}

    with pytest.raises(HfExtError, match="lacks the tensor 'x'"):
        compare_with_reference(torch.nn.Identity(), {"y": torch.zeros(1)}, "r.safetensors", outputs)
    with pytest.raises(HfExtError, match="holds none of the outputs"):
        compare_with_reference(torch.nn.Identity(), {}, "r.safetensors", lambda model, reference: {})
    checks = compare_with_reference(torch.nn.Identity(), {"x": torch.ones(2), "y": torch.ones(2)}, "r.safetensors",
                                    outputs)
    assert [(check.name, check.error, check.passed) for check in checks] == [("y", 0.0, True)]


# ----- the tolerances each converter states ----------------------------------------------------------------------

CONVERSIONS = {entry.name: entry.module(entry.conversion) for entry in MODELS}


def stated_rows():
    """The reliability page's table rows the converters' `REFERENCE_TOLERANCES` make: one per converter and
    tolerance, listing the outputs held to it."""
    rows = []
    for module in CONVERSIONS.values():
        by_tolerance = {}
        for output, tolerance in module.REFERENCE_TOLERANCES.items():
            by_tolerance.setdefault(tolerance, []).append(f"`{output}`")
        rows += [f"| `{module.CONVERT_NAME}` | {', '.join(outputs)} | {tolerance} |"
                 for tolerance, outputs in by_tolerance.items()]
    return rows


def test_the_reliability_page_states_every_converters_tolerances():
    page = RELIABILITY.read_text(encoding="utf-8")
    section = page[page.index("## Parity with a reference"):page.index("## Atomic outputs")]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    assert table == stated_rows()


def test_progress_lines_name_the_output_not_its_staging_folder(tmp_path, capsys):
    """A conversion is written into a hidden staging folder beside OUT and renamed into place: its progress on stderr
    names the source and OUT, never the staging folder (the smallest fixture, the Universal Transformer's)."""
    from conftest import FIXTURES, cli_exit_code

    out = tmp_path / "converted"
    assert cli_exit_code(["convert", "universal-transformer", FIXTURES / "universal_transformer" / "tiny", out]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and ".partial-" not in err and f"{tmp_path}/." not in err, err
