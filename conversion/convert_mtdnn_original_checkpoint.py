#!/usr/bin/env python
"""Convert an original MT-DNN checkpoint (namisan/mt-dnn) into a transformers model folder.

The same command as `hf-ext convert mtdnn`; see `--help`.
"""

import sys

from hf_ext.cli import convert_main
from hf_ext.models.mtdnn import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
