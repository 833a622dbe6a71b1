"""What the `hf-ext` program (`hf_ext.cli`), the model command modules and the `conversion/` scripts share: the
parser class, the arguments every model command takes, a model's command group and converter, and running a parsed
command, the one place where a failure becomes one `PROG: error: ...` line and an exit code.

Every failure a user can cause (bad input, refused checkpoint, bad argument) ends with one `hf-ext: error: ...`
line on stderr and a non-zero exit; set HF_EXT_DEBUG=1 for the traceback.
"""

import argparse
import contextlib
import logging as pylogging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from .arguments import device, fraction, positive_int, report_targets
from .errors import HfExtError, one_line, redact, remote_code_refusal, require

if TYPE_CHECKING:
    from .registration import ModelEntry


class Parser(argparse.ArgumentParser):
    """Usage errors as one `<program>: error: ...` line (exit 2) like every other failure, not a usage dump;
    subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        program = self.prog.split()[0]  # "hf-ext convert NAME" -> "hf-ext"
        # redacted: argparse echoes what it did not understand, a token after a mistyped --token included
        self.exit(2, redact(f"{program}: error: {message} (see {self.prog} --help)") + "\n")


def model_commands(commands: argparse._SubParsersAction, name: str, help_text: str,
                   description: str) -> argparse._SubParsersAction:
    """A model's command group `hf-ext NAME TOOL` (NAME: its conversion's `CONVERT_NAME`, as `hf-ext convert NAME`).
    Returns the group's subparsers, for its tools."""
    group = commands.add_parser(name, help=help_text, description=description)
    return group.add_subparsers(dest="tool", required=True, metavar="TOOL")


def original_checkpoint_of(path: Path) -> "ModelEntry | None":
    """The model whose converter reads `path` (its conversion module's `looks_original`), or None."""
    from .models import MODELS

    return next((entry for entry in MODELS if entry.module(entry.conversion).looks_original(path)), None)


def model_source(text: str) -> str:
    """A MODEL argument: a folder when one of that name exists, else a Hub repo id. A name that can only be a path
    (`./m`, `/m`, `~/m`, `a/b/c`, `m/`) and names no folder is refused at once, before the Hub is asked; so are a file
    and an original checkpoint that a converter reads (with the command that converts it)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    path = Path(text).expanduser()
    if path.exists():
        original = original_checkpoint_of(path)
        if original is not None:
            raise argparse.ArgumentTypeError(f"{text} looks like an original {original.display_name} checkpoint, "
                                             f"not a model folder: convert it first (hf-ext convert "
                                             f"{original.module(original.conversion).CONVERT_NAME} {text} OUT)")
        if path.is_dir():
            return text
        raise argparse.ArgumentTypeError(f"{text} is a file, not a model folder")
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise argparse.ArgumentTypeError(f"no folder named {text}") from None
    return text


def add_model_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The positional MODEL (a folder or Hub repo id, `model_source`) and `--trust-remote-code`, as every command that
    loads a model takes them."""
    parser.add_argument("model", type=model_source, help=help_text)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the folder's own model code")


INFERENCE_DTYPES = ("float32", "bfloat16", "float16", "auto")
TRAINING_DTYPES = ("float32", "bfloat16", "float16")


def add_device_arguments(parser: argparse.ArgumentParser, training: bool = False) -> None:
    """`--device` and `--dtype` of a command that loads a model (`model_loading_settings` reads them) or, with
    `training`, of a training command (`training_device_settings`): there `--dtype` is Trainer's mixed precision, the
    weights staying float32. An unusable device is refused while the arguments are parsed."""
    parser.add_argument("--device", type=device, default="auto", metavar="DEVICE",
                        help="where the model runs: cpu, cuda, cuda:N, mps, or auto (default: cuda when torch finds "
                        "a CUDA device, else cpu)" + ("; Trainer uses every GPU it sees: choose one with "
                                                     "CUDA_VISIBLE_DEVICES" if training else ""))
    if training:
        parser.add_argument("--dtype", choices=TRAINING_DTYPES, default="float32",
                            help="float32 (default), or mixed precision through Trainer: bfloat16 (bf16, CPU or "
                            "GPU) or float16 (fp16 with loss scaling, CUDA only); the weights train and are saved in "
                            "float32")
    else:
        parser.add_argument("--dtype", choices=INFERENCE_DTYPES, default="float32",
                            help="the weights' dtype: float32 (default), bfloat16, float16, or auto (the dtype the "
                            "checkpoint was saved in)")


def _check_device_dtype(args: argparse.Namespace) -> None:
    import torch

    if args.dtype == "bfloat16" and args.device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        raise HfExtError(f"--dtype bfloat16: this GPU ({torch.cuda.get_device_name(args.device)}) has no bfloat16 "
                         "support; use --dtype float16 or float32")


def model_loading_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `from_pretrained` keywords of a command's `--device` and `--dtype`: the weights loaded in that dtype
    straight onto that device (`device_map`). Refuses a dtype the device cannot run in."""
    import torch

    _check_device_dtype(args)
    return {"dtype": "auto" if args.dtype == "auto" else getattr(torch, args.dtype), "device_map": args.device}


def training_device_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainingArguments` of a training command's `--device` and `--dtype`: `use_cpu` for cpu (Trainer takes a
    GPU whenever it finds one), `bf16`/`fp16` mixed precision. Trainer chooses the GPU itself (all it sees), so a
    `cuda:N` is refused with the way to choose one; so is float16, whose loss scaling needs CUDA, elsewhere."""
    _check_device_dtype(args)
    if args.device.startswith("cuda:"):
        raise HfExtError(f"--device {args.device}: Trainer trains on every GPU it sees; choose GPU N with "
                         "CUDA_VISIBLE_DEVICES=N and --device cuda")
    require(args.dtype != "float16" or args.device == "cuda", f"--dtype float16 trains only on CUDA (fp16 mixed "
            f"precision with loss scaling), not on {args.device}: use --dtype bfloat16 or float32")
    settings: dict[str, Any] = {"use_cpu": True} if args.device == "cpu" else {}
    if args.dtype != "float32":
        settings["bf16" if args.dtype == "bfloat16" else "fp16"] = True
    return settings


def add_run_reporting_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every training command shares on how its run is reported (`run_reporting_settings` reads them)."""
    parser.add_argument("--report-to", type=report_targets, default=[], metavar="NAMES",
                        help="experiment trackers Trainer reports to, comma-separated (tensorboard, wandb, mlflow, "
                        "trackio, ...; all: every one installed); default none. The logs go to stderr as JSON lines "
                        "either way, under a progress bar with the time left when stderr is a terminal")


def add_lora_arguments(parser: argparse.ArgumentParser, rank_help: str) -> None:
    """The LoRA options of a training command (`--lora-r`, whose help `rank_help` says what it adapts, `--lora-alpha`,
    `--lora-dropout`); `check_lora_arguments` refuses the last two without the first."""
    parser.add_argument("--lora-r", type=positive_int, help=rank_help)
    parser.add_argument("--lora-alpha", type=float, help="LoRA scaling numerator (default 2 x --lora-r)")
    parser.add_argument("--lora-dropout", type=fraction, default=0.0, help="dropout on the LoRA path (default 0)")


def check_lora_arguments(args: argparse.Namespace) -> None:
    """Refuse `--lora-alpha` or `--lora-dropout` without `--lora-r`."""
    if args.lora_r is None and (args.lora_alpha is not None or args.lora_dropout):
        raise HfExtError("--lora-alpha and --lora-dropout need --lora-r")


def run_reporting_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainingArguments` of a training command's reporting: its `--report-to` trackers, and a progress bar
    when stderr is a terminal and the run is not `--quiet` (JSON log lines only otherwise, for logs and pipes)."""
    return {"report_to": args.report_to,
            "disable_tqdm": not (sys.stderr.isatty() and getattr(args, "verbosity", 0) >= 0)}


def add_converter(converters: argparse._SubParsersAction, conversion: ModuleType) -> None:
    """`hf-ext convert NAME` for a model's conversion module: its `CONVERT_NAME` and `CONVERT_SUMMARY`, its options
    (`add_arguments(parser)`) and its work (`run(args)`)."""
    parser = converters.add_parser(conversion.CONVERT_NAME, help=conversion.CONVERT_SUMMARY,
                                   description=f"Convert {conversion.CONVERT_SUMMARY}.")
    conversion.add_arguments(parser)
    parser.set_defaults(handler=conversion.run)


def checked_argv(parser: argparse.ArgumentParser, argv: list[str] | None) -> list[str]:
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
    return execute(parser.parse_args(checked_argv(parser, argv)), parser.prog)


def needs_the_hub(args: argparse.Namespace) -> bool:
    """Whether a command may reach the Hub: `push`, `--push-to-hub`, or a model argument that is no local path (a
    repo id). Every other command reads and writes local files only, so it runs with the Hub switched off."""
    if getattr(args, "command", None) == "push" or getattr(args, "push_to_hub", None):
        return True
    # MODEL, each --teacher, and the arguments a command names in `model_arguments` (`hf-ext optimus init`'s
    # ENCODER and DECODER)
    models = [getattr(args, "model", None), *(getattr(args, "teacher", None) or []),
              *(getattr(args, name) for name in getattr(args, "model_arguments", ()))]
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


# what gloo raises in a process whose collective lost a peer (a process of the run that failed and exited)
PEER_GONE = "Connection closed by peer"


def describe_failure(error: BaseException) -> str:
    """One line for an unexpected failure: its type and the first line of its message, with the file an OSError
    names."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{type(error).__name__}: {error.filename}: {error.strerror}"
    if isinstance(error, MemoryError):
        return "MemoryError: out of memory (an input announces more data than can be held: is it corrupt?)"
    if isinstance(error, RuntimeError) and PEER_GONE in str(error):
        return "another process of this distributed run stopped (its own error line says why)"
    return f"{type(error).__name__}: {one_line(error)}"


def execute(args: argparse.Namespace, prog: str) -> int:
    """Run a parsed command. This is the one place where failures become one `PROG: error: ...` line and an exit code:
    1 for anything raised (HF_EXT_DEBUG=1 re-raises it for the traceback), 130 for Ctrl-C, 143 for SIGTERM."""
    from .hub import hub_offline

    configure_logging(getattr(args, "verbosity", 0))
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


# the readers of datasets' `json` and `csv` builders, which log an error line before they raise
DATASETS_READER_LOGGERS = ("datasets.packaged_modules.json.json", "datasets.packaged_modules.csv.csv")


def configure_logging(verbosity: int = 0) -> None:
    """hf-ext's own log lines on stderr: progress and warnings (0), warnings only (-1, `--quiet`). transformers'
    notices are off (a command reports what matters itself) unless TRANSFORMERS_VERBOSITY sets their level or
    `--verbose` (1) asks for its warnings."""
    from transformers.utils import logging

    if verbosity > 0:
        logging.set_verbosity_warning()
    elif not os.environ.get("TRANSFORMERS_VERBOSITY"):
        logging.set_verbosity_error()
    logging.disable_progress_bar()
    hf_ext_logger = logging.get_logger("hf_ext")
    if not any(isinstance(handler, StderrLines) for handler in hf_ext_logger.handlers):
        hf_ext_logger.addHandler(StderrLines())
    hf_ext_logger.setLevel(pylogging.WARNING if verbosity < 0 else pylogging.INFO)
    hf_ext_logger.propagate = False
    # the error line of datasets' JSON and CSV readers before they raise: the command's own error names the file and
    # line
    for reader in DATASETS_READER_LOGGERS:
        pylogging.getLogger(reader).setLevel(pylogging.NOTSET if verbosity > 0 else pylogging.CRITICAL)


class StderrLines(pylogging.Handler):
    """hf-ext's log records as lines on stderr: progress as it is, warnings prefixed. `sys.stderr` is looked up at
    each record (so that redirections and pytest's capture apply), and each line goes out in one write, so that a
    Ctrl-C cannot leave a line unfinished for the error message to be glued to."""

    def emit(self, record: pylogging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= pylogging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        sys.stderr.write(f"{message}\n")
