"""The README's test command, `python -m pytest -m "not slow"`: a module marked slow as a whole is not even imported
(`conftest.pytest_ignore_collect`), one with some slow tests is, and every other selection imports everything."""

from types import SimpleNamespace

import pytest
import torch
from conftest import NO_CUDA_REASON, pytest_collection_modifyitems, pytest_ignore_collect

WHOLLY_SLOW = "import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.usefixtures(\"tmp_path\")]\n"
PARTLY_SLOW = "import pytest\n\n\n@pytest.mark.slow\ndef test_one():\n    pass\n"


def selecting(markexpr: str) -> SimpleNamespace:
    return SimpleNamespace(getoption=lambda name: {"markexpr": markexpr}[name])


@pytest.mark.parametrize("markexpr, wholly_slow_ignored", [
    ("not slow", True), ("not  slow", True), ("", None), ("slow", None), ("not slow and not gpu", None)])
def test_only_the_fast_tier_leaves_wholly_slow_modules_out(tmp_path, markexpr, wholly_slow_ignored):
    (tmp_path / "test_wholly.py").write_text(WHOLLY_SLOW)
    (tmp_path / "test_partly.py").write_text(PARTLY_SLOW)
    (tmp_path / "helpers.py").write_text(WHOLLY_SLOW)
    assert pytest_ignore_collect(tmp_path / "test_wholly.py", selecting(markexpr)) is wholly_slow_ignored
    assert pytest_ignore_collect(tmp_path / "test_partly.py", selecting(markexpr)) is None
    assert pytest_ignore_collect(tmp_path / "helpers.py", selecting(markexpr)) is None


class Item(SimpleNamespace):
    """What `pytest_collection_modifyitems` reads of a collected test: its markers, and the ones it adds."""

    def get_closest_marker(self, name):
        return next((marker for marker in self.markers if marker.name == name), None)

    def add_marker(self, marker):
        self.markers.append(marker.mark)


@pytest.mark.parametrize("cuda", [False, True])
def test_gpu_tests_are_skipped_with_a_reason_without_cuda_and_run_with_it(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    gpu, cpu = Item(markers=[pytest.mark.gpu.mark]), Item(markers=[pytest.mark.slow.mark])
    pytest_collection_modifyitems(None, [gpu, cpu])
    skips = [marker.kwargs["reason"] for marker in gpu.markers if marker.name == "skip"]
    assert skips == ([] if cuda else [NO_CUDA_REASON]) and [marker.name for marker in cpu.markers] == ["slow"]


def test_the_fast_tier_selects_the_gpu_tests_so_that_they_show_as_skipped(repo_root):
    """The README's and .ci/run's `-m "not slow"` keeps the gpu tests (skipped without CUDA, with their reason in
    the `-ra` summary): none is also marked slow, which would leave it out of that selection unseen."""
    import re

    marking = re.compile(r"^(?:pytestmark = |@pytest\.mark\.).*$", re.MULTILINE)  # a module's or a test's marks
    marked = {path.name: {name for line in marking.findall(path.read_text(encoding="utf-8"))
                          for name in re.findall(r"\b(gpu|slow)\b", line)}
              for path in (repo_root / "tests").rglob("test_*.py")}
    with_gpu = [name for name, found in marked.items() if "gpu" in found]
    assert "test_gpu.py" in with_gpu
    assert not [name for name in with_gpu if "slow" in marked[name]], "gpu tests also marked slow"
