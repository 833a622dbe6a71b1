"""Every figure a page shows from a run is generated from a committed results file (`docs/publish.py`): a page that
differs from its results fails here, a results file names the commit and the command that produced it, and a
reproduction's results hold three seeds or more of a full run."""

import importlib.util
import json
import re

import pytest
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("publish", REPO_ROOT / "docs" / "publish.py")
publish = importlib.util.module_from_spec(spec)
spec.loader.exec_module(publish)

RESULTS = sorted([*(REPO_ROOT / "reproductions" / "results").glob("*.json"),
                  *(REPO_ROOT / "benchmarks" / "results").glob("*.json"), publish.DEMO_RESULTS,
                  publish.CONVERSIONS_RESULTS])
PUBLISHED = {match.group("source") for page in publish.PAGES
             for match in publish.BLOCK.finditer(page.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("page", publish.PAGES, ids=lambda page: page.name)
def test_every_figures_block_equals_what_its_results_file_generates(page):
    stale = publish.stale_blocks(page.read_text(encoding="utf-8"))
    assert not stale, f"{page.name}: rerun `python docs/publish.py` (or the run itself): {stale}"


@pytest.mark.parametrize("results", RESULTS, ids=lambda path: path.stem)
def test_every_results_file_is_published_and_says_where_it_came_from(results):
    source = results.relative_to(REPO_ROOT).as_posix()
    assert source in PUBLISHED, f"{source} is on no page"
    figures = json.loads(results.read_text(encoding="utf-8"))
    assert re.fullmatch(r"[0-9a-f]{40}", figures["commit"]), (
        f"{source} was produced by uncommitted code ({figures['commit']}): commit, then rerun")
    assert figures["command"].split()[0] in ("python", "hf-ext")
    assert figures["date"] and figures["machine"] and figures["versions"]["torch"]
    assert not figures.get("quick"), f"{source} is a --quick smoke run, not a result"
    if "script" in figures:
        assert figures["command"].startswith(f"python {figures['script']}")
    if "per_seed" in figures:  # a reproduction or the demo: several seeds
        assert len(figures["seeds"]) >= 3, f"{source}: three seeds at least"
        assert [seed["seed"] for seed in figures["per_seed"]] == figures["seeds"]


@pytest.mark.parametrize("page", publish.PAGES, ids=lambda page: page.name)
def test_every_figures_marker_opens_a_block_the_check_reads(page):
    """A marker the block pattern does not match (a view it cannot read, a missing end line) would be neither
    rendered nor checked."""
    text = page.read_text(encoding="utf-8")
    blocks = [match.start() for match in publish.BLOCK.finditer(text)]
    markers = [match.start() for match in re.finditer(r"<!-- figures from ", text)]
    assert markers == blocks, f"{page.name}: a figures marker that opens no block the check reads"


def test_the_check_finds_a_changed_figure_and_a_missing_results_file():
    text, match, number = next((text, match, number) for page in publish.PAGES
                               for text in [page.read_text(encoding="utf-8")]
                               for match in publish.BLOCK.finditer(text)
                               if (number := re.search(r"\d\.\d\d", match.group("body"))))  # a figure in a block
    changed = text[:match.start("body") + number.start()] + "9.99" + text[match.start("body") + number.end():]
    (stale,) = publish.stale_blocks(changed)
    assert stale.startswith(match.group("source")) and "9.99" in stale
    assert publish.stale_blocks(publish.published(changed)) == []
    with pytest.raises(SystemExit, match="no such results file"):
        publish.stale_blocks("<!-- figures from docs/results/gone.json -->\n| 1.00 |\n<!-- end of figures -->")


def test_a_run_outputs_change_is_not_a_code_change(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.delenv("HF_EXT_COMMIT", raising=False)

    from hf_ext.provenance import checkout_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "docs" / "images").mkdir(parents=True)
    (tmp_path / "docs" / "images" / "plot.png").write_bytes(b"old")
    (tmp_path / "script.py").write_text("print(1)\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "start")
    head = checkout_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    (tmp_path / "docs" / "images" / "plot.png").write_bytes(b"new")  # what a run writes: still that commit
    assert checkout_commit(tmp_path) == head
    (tmp_path / "script.py").write_text("print(2)\n")  # the code changed: not that commit
    assert checkout_commit(tmp_path) == head + "+changes"
    assert checkout_commit(tmp_path / "docs" / "images" / "nowhere") == "unknown"
    # a copy run on another machine is the commit its sender names, whatever .git travelled with it
    told = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("HF_EXT_COMMIT", told)
    assert checkout_commit(tmp_path) == checkout_commit(tmp_path / "nowhere") == told
