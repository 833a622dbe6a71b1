#!/usr/bin/env python
"""Convert a Universal Transformer checkpoint of the PyTorch re-implementation (andreamad8/Universal-Transformer-Pytorch)
into a transformers model folder.

The same command as `hf-ext convert universal-transformer`; see `--help`.
"""

import sys

from hf_ext.cli import convert_main
from hf_ext.models.universal_transformer import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
