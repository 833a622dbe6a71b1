#!/usr/bin/env python
"""Convert an ERNIE 2.0 PaddlePaddle checkpoint (static release folder or PaddleNLP folder) into a transformers
`ernie` model folder, without paddle.

The same command as `hf-ext convert ernie2`; see `--help`.
"""

import sys

from hf_ext.cli import convert_main
from hf_ext.models.ernie2 import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
