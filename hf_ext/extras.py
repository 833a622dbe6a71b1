"""The command that installs one of hf-ext's optional extras, written for the way this hf-ext was installed: from a
clone (an editable or local install, the way the README installs it) the extra must come from that clone, since a
bare `hf-ext[extra]` would look for a package on the index."""

import json
from importlib import metadata
from urllib.parse import unquote, urlparse

DISTRIBUTION = "hf-ext"


def install_command(extra: str) -> str:
    """`pip install -e '/path/to/clone[EXTRA]'` for an editable install from a clone, `pip install '/path[EXTRA]'`
    for another local install, `pip install 'hf-ext[EXTRA]'` otherwise (read from the install's `direct_url.json`,
    PEP 610). Every install found on the path is asked: from inside a clone, the clone's own `hf_ext.egg-info`,
    which records no origin, comes first."""
    for distribution in metadata.distributions(name=DISTRIBUTION):
        origin = distribution.read_text("direct_url.json")
        if not origin:
            continue
        record = json.loads(origin)
        url = urlparse(record.get("url", ""))
        if url.scheme == "file" and "dir_info" in record:
            editable = "-e " if record["dir_info"].get("editable") else ""
            return f"pip install {editable}'{unquote(url.path)}[{extra}]'"
        break
    return f"pip install '{DISTRIBUTION}[{extra}]'"
