#!/usr/bin/env python
"""`hf-ext convert mtdnn` as a script: convert original MT-DNN checkpoints (namisan/mt-dnn); see `--help`."""

import sys

from hf_ext.cli_utils import convert_main
from hf_ext.models.mtdnn import conversion

if __name__ == "__main__":
    sys.exit(convert_main(conversion))
