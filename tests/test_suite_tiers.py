"""The README's test command, `python -m pytest -m "not slow"`: a module marked slow as a whole is not even imported
(`conftest.pytest_ignore_collect`), one with some slow tests is, and every other selection imports everything."""

from types import SimpleNamespace

import pytest
from conftest import pytest_ignore_collect

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
