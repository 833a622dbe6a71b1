"""The `hf-ext` command: conversion, Hub publishing, the apps in the browser and each model's own tools.

Every failure a user can cause (bad input, refused checkpoint, bad argument) ends with one `hf-ext: error: ...`
line on stderr and a non-zero exit; set HF_EXT_DEBUG=1 for the traceback.
"""

import argparse
import contextlib
import importlib
import logging as pylogging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import NoReturn

from .arguments import TOKEN_HELP, hub_token
from .errors import HfExtError, one_line, redact, remote_code_refusal
from .models import MODELS
from .serve import add_serve_command


class Parser(argparse.ArgumentParser):
    """Usage errors as one `<program>: error: ...` line (exit 2) like every other failure, not a usage dump;
    subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        program = self.prog.split()[0]  # "hf-ext convert optimus" -> "hf-ext"
        # redacted: argparse echoes what it did not understand, a token after a mistyped --token included
        self.exit(2, redact(f"{program}: error: {message} (see {self.prog} --help)") + "\n")


def build_parser(prog: str = "hf-ext") -> Parser:
    parser = Parser(prog=prog, description="Research models as Hugging Face transformers models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    convert = commands.add_parser("convert", help="convert an original checkpoint into a transformers folder",
                                  description="Convert an original research checkpoint into a model folder that "
                                  "loads with AutoModel.from_pretrained (written atomically).")
    converters = convert.add_subparsers(dest="converter", required=True, metavar="MODEL")
    push = commands.add_parser("push", help="upload a model folder to the Hub as one commit",
                               description="Create REPO_ID if needed and upload DIR to it as a single commit.")
    push.add_argument("dir", help="model folder (as written by hf-ext convert or save_pretrained)")
    push.add_argument("repo_id", help="Hub repository, e.g. my-org/optimus-snli")
    push.add_argument("--private", action="store_true", help="create the repository as private")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.add_argument("--commit-message", help="commit message")
    push.add_argument("--token", type=hub_token, help=TOKEN_HELP)
    push.add_argument("--skip-refused", action="store_true",
                      help="leave out, with a warning, what push refuses otherwise: hidden files and folders, links "
                      "that lead out of DIR (and the Hub cache), anything that is not a regular file")
    push.set_defaults(handler=_run_push)
    export = commands.add_parser("export", help="export a model folder for other runtimes",
                                 description="Export a model folder for other runtimes.")
    formats = export.add_subparsers(dest="format", required=True, metavar="FORMAT")
    onnx = formats.add_parser(
        "onnx", help="ONNX graphs checked on ONNX Runtime (needs: pip install 'hf-ext[onnx]')",
        description="Export MODEL (a folder or Hub repo id of an Optimus, Universal Transformer, MT-DNN or ERNIE "
        "model) to ONNX graphs in the new folder OUT, each checked on ONNX Runtime against PyTorch at two shapes "
        "(max abs error at most 1e-4), with the checks in OUT/onnx_export.json and OUT/README.md. Needs the onnx "
        "extra: pip install 'hf-ext[onnx]'.")
    add_model_argument(onnx, "model folder or Hub repo id")
    onnx.add_argument("out", help="output folder (written atomically)")
    onnx.add_argument("--task", help="what to export (default: the folder's own head; see docs/export.md)")
    onnx.add_argument("--quantize", choices=["int8"], help="also write <graph>_int8.onnx (dynamic int8 quantization "
                      "of the weights) and measure its errors")
    onnx.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    onnx.set_defaults(handler=_run_export_onnx)
    add_serve_command(commands)

    for name in MODELS:  # each model adds its converter and its own commands
        importlib.import_module(f"hf_ext.models.{name}.commands").register(commands, converters)
    return parser


def model_commands(commands: argparse._SubParsersAction, converters: argparse._SubParsersAction,
                   conversion: ModuleType, help_text: str, description: str) -> argparse._SubParsersAction:
    """A model's `hf-ext convert NAME` (its conversion module, see `add_converter`) and its command group
    `hf-ext NAME TOOL`, NAME being the conversion's `CONVERT_NAME`. Returns the group's subparsers, for its tools."""
    add_converter(converters, conversion)
    group = commands.add_parser(conversion.CONVERT_NAME, help=help_text, description=description)
    return group.add_subparsers(dest="tool", required=True, metavar="TOOL")


def add_model_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The positional MODEL (a folder or Hub repo id) and `--trust-remote-code`, as every command that loads a model
    takes them."""
    parser.add_argument("model", help=help_text)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the folder's own model code")


def add_converter(converters: argparse._SubParsersAction, conversion: ModuleType) -> None:
    """`hf-ext convert NAME` for a model's conversion module: its `CONVERT_NAME` and `CONVERT_SUMMARY`, its options
    (`add_arguments(parser)`) and its work (`run(args)`)."""
    parser = converters.add_parser(conversion.CONVERT_NAME, help=conversion.CONVERT_SUMMARY,
                                   description=f"Convert {conversion.CONVERT_SUMMARY}.")
    conversion.add_arguments(parser)
    parser.set_defaults(handler=conversion.run)


def _run_push(args):
    from .hub import push_folder

    print(push_folder(args.dir, args.repo_id, token=args.token, private=args.private, revision=args.revision,
                      commit_message=args.commit_message, skip_refused=args.skip_refused))


def _run_export_onnx(args):
    from .onnx_export import export_onnx

    report = export_onnx(args.model, args.out, task=args.task, quantize=args.quantize,
                         trust_remote_code=args.trust_remote_code, overwrite=args.overwrite)
    for graph in report["graphs"]:
        line = (f"{graph['file']}: max abs error {max(c['max_abs_error'] for c in graph['checks']):.1e} against "
                f"PyTorch over {len(graph['checks'])} shapes")
        if "int8" in graph:
            line += (f"; {graph['int8']['file']}: "
                     f"{max(c['max_abs_error'] for c in graph['int8']['checks']):.1e}")
        print(line)
    print(f"wrote {args.out} (task {report['task']}, {report['seconds']} s)")


def main(argv: list[str] | None = None, prog: str = "hf-ext") -> int:
    parser = build_parser(prog)
    return execute(parser.parse_args(_checked_argv(parser, argv)), prog)


def _checked_argv(parser, argv):
    """The arguments, refused as a usage error when one holds bytes that are not UTF-8 (Python keeps them as lone
    surrogates, which file names for safetensors and the Hub, and printed text, cannot hold)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    for argument in argv:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            parser.error(f"argument '{argument.encode('utf-8', 'backslashreplace').decode()}' is not valid UTF-8")
    return argv


def convert_main(conversion: ModuleType, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Entry point of a `conversion/` script: `hf-ext convert NAME` of a model's conversion module, under the
    script's own name."""
    parser = Parser(prog=prog, description=f"Convert {conversion.CONVERT_SUMMARY} (same as `hf-ext convert "
                    f"{conversion.CONVERT_NAME}`).")
    conversion.add_arguments(parser)
    parser.set_defaults(handler=conversion.run)
    return execute(parser.parse_args(_checked_argv(parser, argv)), parser.prog)


def needs_the_hub(args: argparse.Namespace) -> bool:
    """Whether a command may reach the Hub: `push`, `--push-to-hub`, or a model argument that is no local path (a
    repo id). Every other command reads and writes local files only, so it runs with the Hub switched off."""
    if getattr(args, "command", None) == "push" or getattr(args, "push_to_hub", None):
        return True
    models = [getattr(args, "model", None), *(getattr(args, "teacher", None) or [])]
    return any(isinstance(name, str) and not os.path.exists(name) for name in models)


class Terminated(BaseException):
    """SIGTERM (from `timeout`, Slurm, `docker stop`), raised like KeyboardInterrupt so that staging folders are
    removed on the way out."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM raises `Terminated` while a command runs (in the main thread only, where Python handles signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def describe_failure(error: BaseException) -> str:
    """One line for an unexpected failure: its type and the first line of its message, with the file an OSError
    names."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{type(error).__name__}: {error.filename}: {error.strerror}"
    if isinstance(error, MemoryError):
        return "MemoryError: out of memory (an input announces more data than can be held: is it corrupt?)"
    return f"{type(error).__name__}: {one_line(error)}"


def execute(args: argparse.Namespace, prog: str) -> int:
    """Run a parsed command. This is the one place where failures become one `PROG: error: ...` line and an exit code:
    1 for anything raised (HF_EXT_DEBUG=1 re-raises it for the traceback), 130 for Ctrl-C, 143 for SIGTERM."""
    from .hub import hub_offline

    _quiet_libraries()
    try:
        with terminate_as_exception(), contextlib.nullcontext() if needs_the_hub(args) else hub_offline():
            args.handler(args)
    except HfExtError as error:
        return _fail(prog, remote_code_refusal(error) or str(error))
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", code=130)
    except Terminated:
        return _fail(prog, "terminated (SIGTERM)", code=128 + signal.SIGTERM)
    except Exception as error:  # noqa: BLE001 - every failure ends as one line; HF_EXT_DEBUG shows the traceback
        if os.environ.get("HF_EXT_DEBUG"):
            raise
        return _fail(prog, remote_code_refusal(error) or describe_failure(error))
    return 0


def _fail(prog, message, code=1):
    sys.stderr.write(f"{prog}: error: {redact(message)}\n")
    sys.stderr.flush()
    return code


def _quiet_libraries():
    """transformers' notices off (a command reports what matters itself); hf-ext's own log lines on stderr."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    hf_ext_logger = logging.get_logger("hf_ext")
    if not any(isinstance(handler, StderrLines) for handler in hf_ext_logger.handlers):
        hf_ext_logger.addHandler(StderrLines())
    hf_ext_logger.setLevel(pylogging.INFO)
    hf_ext_logger.propagate = False


class StderrLines(pylogging.Handler):
    """hf-ext's log records as lines on stderr: progress as it is, warnings prefixed. `sys.stderr` is looked up at
    each record (so that redirections and pytest's capture apply), and each line goes out in one write, so that a
    Ctrl-C cannot leave a line unfinished for the error message to be glued to."""

    def emit(self, record: pylogging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= pylogging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        sys.stderr.write(f"{message}\n")


if __name__ == "__main__":
    sys.exit(main())
