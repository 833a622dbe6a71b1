"""`hf_ext.extras.install_command`: the hint for a missing extra installs it the way hf-ext was installed (a clone,
as the README installs it, or a package index)."""

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from hf_ext import extras


class Installed:
    """What `importlib.metadata` finds of an install whose `direct_url.json` (PEP 610) is `record`."""

    def __init__(self, record):
        self.record = record

    def read_text(self, name):
        assert name == "direct_url.json"
        return None if self.record is None else json.dumps(self.record)


@pytest.mark.parametrize("record, expected", [
    ({"url": "file:///home/me/hf-ext", "dir_info": {"editable": True}}, "pip install -e '/home/me/hf-ext[onnx]'"),
    ({"url": "file:///home/me/my%20clone", "dir_info": {}}, "pip install '/home/me/my clone[onnx]'"),
    ({"url": "https://example.org/hf_ext-0.1.0.tar.gz", "archive_info": {}}, "pip install 'hf-ext[onnx]'"),
    (None, "pip install 'hf-ext[onnx]'"),  # from an index: no direct_url.json
], ids=["editable clone", "local folder", "archive URL", "package index"])
def test_the_hint_follows_the_install(record, expected, monkeypatch):
    # a clone's own hf_ext.egg-info, which records no origin, is found first from inside the clone
    monkeypatch.setattr(metadata, "distributions", lambda name: [Installed(None), Installed(record)])
    assert extras.install_command("onnx") == expected


def test_without_an_install_the_hint_names_the_package(monkeypatch):
    monkeypatch.setattr(metadata, "distributions", lambda name: [])
    assert extras.install_command("app") == "pip install 'hf-ext[app]'"


def test_this_checkout_is_installed_from_its_folder():
    """The suite runs on an install of this repository (`pip install -e .`), whose hint points at the repository."""
    installed_from = re.fullmatch(r"pip install (?:-e )?'(.+)\[plots\]'", extras.install_command("plots"))
    assert installed_from and Path(installed_from.group(1)).resolve() == REPO_ROOT
