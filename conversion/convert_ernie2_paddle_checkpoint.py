#!/usr/bin/env python
"""`hf-ext convert ernie2` as a script: convert ERNIE 2.0 PaddlePaddle checkpoints (static release or PaddleNLP),
without paddle; see `--help`."""

import sys

from hf_ext.cli_utils import convert_main
from hf_ext.models.ernie2 import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
