#!/usr/bin/env python
"""`hf-ext convert universal-transformer` as a script: convert Universal Transformer checkpoints of the PyTorch re-
implementation (andreamad8/Universal-Transformer-Pytorch); see `--help`."""

import sys

from hf_ext.cli_utils import convert_main
from hf_ext.models.universal_transformer import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
