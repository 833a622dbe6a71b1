#!/usr/bin/env python
"""Convert an original Optimus checkpoint (ChunyuanLI/Optimus) into a transformers model folder.

The same command as `hf-ext convert optimus`; see `--help`.
"""

import sys

from hf_ext.cli import convert_main
from hf_ext.models.optimus import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
