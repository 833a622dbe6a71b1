"""The end of a script that the tests run under torchrun (tests/*/*_ddp_train.py): `run_then_leave(main, *args)`."""

import os
import sys

import torch


def run_then_leave(main, *args) -> None:
    """Run `main(*args)`, then leave the process. torch 2.13's gloo can abort the interpreter's teardown ("terminate
    called without an active exception") after the results are written: shut the group down, then exit without
    that teardown."""
    main(*args)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
