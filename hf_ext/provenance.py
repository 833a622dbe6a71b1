"""Where a measured figure came from, as the scripts that produce published figures record it (`benchmarks/`,
`reproductions/`, `docs/publish.py`): the commit of the checkout and the machine."""

import json
import os
import platform
import subprocess
from pathlib import Path

import torch
import transformers

# what those runs write themselves (plots, results files): a change there does not change the code that runs
RUN_OUTPUTS = ("docs/images", "docs/results", "benchmarks/results", "reproductions/results")


def checkout_commit(repository: str | Path) -> str:
    """The commit of the checkout at `repository`, `+changes` when a tracked file other than a run output differs
    from it, `unknown` outside a git checkout; or the commit that `HF_EXT_COMMIT` names, the sender's word for a copy
    of a clean checkout run on another machine (whose `.git`, if it travels at all, can be stale)."""
    told = os.environ.get("HF_EXT_COMMIT")
    if told:
        return told
    excluded = [f":(exclude){path}" for path in RUN_OUTPUTS]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *excluded],
                                 cwd=repository, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if changed else "")


def machine_description() -> str:
    """The architecture, the processor as Linux names it (`platform.processor()` is empty there), the cores and the
    GPU where torch finds one."""
    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), model)
    gpu = f", GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{platform.machine()}, {model or 'unknown processor'}, {os.cpu_count()} CPU cores{gpu}"


def software_versions() -> dict[str, str]:
    """The versions a measured figure depends on most."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def write_results(path: str | Path, results: dict) -> None:
    """Write a results file whole or not at all: into `PATH.partial`, then renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
