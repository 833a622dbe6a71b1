"""The `hf-ext` command: conversion, Hub publishing, the apps in the browser and each model's own tools. The program's
entry point (the console script): no module of the package imports it; what commands share is in
`hf_ext.cli_utils`.

Every failure a user can cause (bad input, refused checkpoint, bad argument) ends with one `hf-ext: error: ...`
line on stderr and a non-zero exit; set HF_EXT_DEBUG=1 for the traceback.
"""

import logging
import sys

# bitsandbytes (the quantize extra), imported by peft while commands are set up, warns through the standard logger
# without a handler when an optional kernel package is absent: a line on every command's stderr otherwise
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

from . import __version__  # noqa: E402 (these imports follow the logger setting above)
from .arguments import TOKEN_HELP, hub_token  # noqa: E402
from .cli_utils import Parser, add_converter, add_model_argument, checked_argv, execute  # noqa: E402
from .models import MODELS  # noqa: E402
from .serve import add_serve_command  # noqa: E402


def build_parser(prog: str = "hf-ext") -> Parser:
    parser = Parser(prog=prog, description="Research models as Hugging Face transformers models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=0,
                          help="also show transformers' own warnings")
    loudness.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                          help="show only warnings and errors, no progress lines")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    convert = commands.add_parser("convert", help="convert an original checkpoint into a transformers folder",
                                  description="Convert an original research checkpoint into a model folder that "
                                  "loads with AutoModel.from_pretrained (written atomically).")
    converters = convert.add_subparsers(dest="converter", required=True, metavar="MODEL")
    push = commands.add_parser("push", help="upload a model folder to the Hub as one commit",
                               description="Create REPO_ID if needed and upload DIR to it as a single commit. "
                               "The folder's model card (README.md) is published loading the model by REPO_ID "
                               "where it named the folder.")
    push.add_argument("dir", help="model folder (as written by hf-ext convert or save_pretrained)")
    push.add_argument("repo_id", help="Hub repository, e.g. my-org/my-model")
    push.add_argument("--private", action="store_true", help="create the repository as private")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.add_argument("--commit-message", help="commit message")
    push.add_argument("--token", type=hub_token, help=TOKEN_HELP)
    push.add_argument("--skip-refused", action="store_true",
                      help="leave out, with a warning, what push refuses otherwise: hidden files and folders, links "
                      "that lead out of DIR (and the Hub cache), anything that is not a regular file")
    push.add_argument("--allow-no-card", action="store_true",
                      help="publish a folder without a model card (README.md), which push refuses otherwise")
    push.set_defaults(handler=_run_push)
    export = commands.add_parser("export", help="export a model folder for other runtimes",
                                 description="Export a model folder for other runtimes.")
    formats = export.add_subparsers(dest="format", required=True, metavar="FORMAT")
    exportable = ", ".join(entry.display_name for entry in MODELS if entry.export_onnx is not None)
    from .onnx_export import QUANTIZATIONS

    onnx = formats.add_parser(
        "onnx", help="ONNX graphs checked on ONNX Runtime (needs the onnx extra)",
        description=f"Export MODEL (a folder or Hub repo id of a model hf-ext exports: {exportable}) to ONNX graphs "
        "in the new folder OUT, each checked on ONNX Runtime against PyTorch at two shapes (max abs error at most "
        "1e-4 x the output's largest magnitude where above 1), with the checks in OUT/onnx_export.json and "
        "OUT/README.md. It traces and "
        "checks on the CPU in float32 by design, whatever GPU the machine has: ONNX Runtime chooses where the graphs "
        "run (docs/gpu.md). Needs the onnx extra (docs/install.md).")
    add_model_argument(onnx, "model folder or Hub repo id")
    onnx.add_argument("out", help="output folder (written atomically)")
    onnx.add_argument("--task", help="what to export (default: the folder's own head; see docs/export.md)")
    onnx.add_argument("--quantize", choices=list(QUANTIZATIONS), help="also write <graph>_<scheme>.onnx and measure "
                      "its errors: " + "; ".join(f"{scheme}: {what}" for scheme, what in QUANTIZATIONS.items()))
    onnx.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    onnx.set_defaults(handler=_run_export_onnx)
    add_serve_command(commands)

    for entry in MODELS:  # each model's converter, and its own commands
        add_converter(converters, entry.module(entry.conversion))
        if entry.commands is not None:
            entry.module(entry.commands).register(commands)
    return parser


def _run_push(args):
    from .hub import push_folder

    print(push_folder(args.dir, args.repo_id, token=args.token, private=args.private, revision=args.revision,
                      commit_message=args.commit_message, skip_refused=args.skip_refused,
                      allow_no_card=args.allow_no_card))


def _run_export_onnx(args):
    from .onnx_export import export_onnx

    report = export_onnx(args.model, args.out, task=args.task, quantize=args.quantize,
                         trust_remote_code=args.trust_remote_code, overwrite=args.overwrite)
    for graph in report["graphs"]:
        line = (f"{graph['file']}: max abs error {max(c['max_abs_error'] for c in graph['checks']):.1e} against "
                f"PyTorch over {len(graph['checks'])} shapes")
        if args.quantize is not None:
            quantized = graph[args.quantize]
            line += f"; {quantized['file']}: {max(c['max_abs_error'] for c in quantized['checks']):.1e}"
        print(line)
    print(f"wrote {args.out} (task {report['task']}, {report['seconds']} s)")


def main(argv: list[str] | None = None, prog: str = "hf-ext") -> int:
    parser = build_parser(prog)
    return execute(parser.parse_args(checked_argv(parser, argv)), prog)


if __name__ == "__main__":
    sys.exit(main())
