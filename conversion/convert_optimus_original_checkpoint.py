#!/usr/bin/env python
"""`hf-ext convert optimus` as a script: convert original Optimus checkpoints (ChunyuanLI/Optimus); see `--help`."""

import sys

from hf_ext.cli_utils import convert_main
from hf_ext.models.optimus import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
