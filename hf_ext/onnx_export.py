"""Export to ONNX and check on ONNX Runtime (the `onnx` extra, docs/install.md).

Each model package that can be exported has an `export_onnx` module declaring the model types it exports
(`MODEL_TYPES`), the tasks a config offers (`tasks(config)`, the first being the default) and
`plan(source, config, task, trust_remote_code)`, which loads the model and returns the graphs to write (`OnnxGraph`).
This module does the rest, the same for every model: export with `torch.onnx.export` (the dynamo exporter), check
every graph on ONNX Runtime against PyTorch at the export shape and at a second one (dynamic axes), quantize to int8
or 4-bit if asked (`onnxruntime.quantization`), and write the graphs, the config and tokenizer files,
`onnx_export.json` (what was checked, with the errors) and a model card into an atomically written folder.
"""

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import logging as pylogging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import logging

from .errors import HfExtError
from .extras import install_command
from .hub import card_data, checked_link_target, link_roots, model_name, write_model_card
from .loading import load_config, loading
from .models import modules_by_model_type
from .output import atomic_output_dir, check_output_dir, copy_file

if TYPE_CHECKING:
    import onnxruntime

logger = logging.get_logger(__name__)

REPORT_NAME = "onnx_export.json"
FLOAT_TOLERANCE = 1e-4  # ONNX Runtime against PyTorch, float32 graphs
# `--quantize` schemes: what each writes (`<graph>_<scheme>.onnx`, "-" as "_"), for the CLI's help and the docs
QUANTIZATIONS = {
    "int8": "int8 weights of MatMul and Gemm in blocks of 32, one scale each (ONNX Runtime's MatMulNBits; it "
            "quantizes the activations in blocks of 32 as it multiplies)",
    "int4": "the same with 4-bit weights",
    "int8-dynamic": "int8 weights with one scale per output channel, activations quantized per tensor at run time "
                    "(MatMulInteger)",
}
BLOCK_SIZE = 32  # of MatMulNBits' weights: blocks of 128 changed more greedy tokens (docs/export.md)
# MatMulNBits' accuracy level 4 multiplies in int8 (each row of activations quantized in blocks of the weight's block
# size at run time); level 0 (float32 arithmetic) has no fast 8-bit kernel on the CPU in ONNX Runtime 1.32 and decoded
# 9x slower than float32 (docs/export.md)
ACCURACY_LEVEL = 4
OPSET = 18
# what a model folder holds besides its weights, copied beside the graphs so that the export folder is self-contained
# (config, tokenizer or processor, generation config, and the model code a config with `auto_map` loads)
COPIED_SUFFIXES = (".json", ".txt", ".model", ".py")
NOT_COPIED = ("model.safetensors.index.json", REPORT_NAME)

Inputs = dict[str, torch.Tensor]
TEXT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
TEXT_AXES = {0: "batch", 1: "sequence"}


@dataclasses.dataclass
class OnnxGraph:
    """One graph to write as `<name>.onnx`.

    `module` takes the inputs in the order of `input_names` (positional arguments) and returns a tuple of tensors
    named by `output_names`. `dynamic_axes` names the dynamic axes of each input (`{input: {axis: dim name}}`);
    `make_inputs(dims, generator)` builds valid inputs for given sizes of those dims. The graph is exported at
    `export_dims` and checked there and at every entry of `check_dims`. `label_outputs` are outputs whose argmax over
    the last axis is a prediction (the int8 graph's agreement with the float model is measured on them)."""

    name: str
    module: torch.nn.Module
    input_names: list[str]
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]]
    make_inputs: Callable[[dict[str, int], torch.Generator], Inputs]
    export_dims: dict[str, int]
    check_dims: list[dict[str, int]]
    label_outputs: tuple[str, ...] = ()


@dataclasses.dataclass
class ExportPlan:
    """What `plan` of a model's `export_onnx` module returns: the loaded model (its config is saved beside the graphs),
    the graphs, the task and what the docs and the report should say about the export's scope."""

    model: PreTrainedModel
    task: str
    graphs: list[OnnxGraph]
    notes: list[str] = dataclasses.field(default_factory=list)


def require_onnx() -> None:
    """One clear error when the `[onnx]` extra is missing."""
    missing = [name for name in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise HfExtError(f"ONNX export needs {', '.join(missing)}: {install_command('onnx')}")


def exporters() -> dict[str, ModuleType]:
    """`{model_type: export_onnx module}` over the models that have one."""
    return modules_by_model_type("export_onnx")


def exporter_for(model_type: str, source: str) -> ModuleType:
    """The `export_onnx` module for `model_type`, or one error line listing what can be exported."""
    found = exporters()
    if model_type not in found:
        raise HfExtError(f"{source} holds a {model_type!r} model, which hf-ext cannot export to ONNX (supported: "
                         f"{', '.join(sorted(found))})")
    return found[model_type]


def resolve_task(module: ModuleType, config: PretrainedConfig, task: str | None, source: str) -> str:
    """The task to export: `task` if the model offers it, else its default (the first of `module.tasks(config)`)."""
    tasks = list(module.tasks(config))
    if task is None:
        return tasks[0]
    if task not in tasks:
        raise HfExtError(f"task {task!r} cannot be exported from {source} (tasks: {', '.join(tasks)})")
    return task


def text_inputs(dims: dict[str, int], generator: torch.Generator, vocab_size: int, pad_token_id: int = 0,
                pairs: bool = True) -> Inputs:
    """Random `input_ids`, `attention_mask` and `token_type_ids` of `dims["batch"] x dims["sequence"]`: the first row
    full, the others right-padded to lengths between half and all of it, and with `pairs` a second segment (type 1)
    over the second half of each row's tokens. Ids avoid the pad id and the lowest ids (special tokens)."""
    batch, length = dims["batch"], dims["sequence"]
    low = min(5, vocab_size - 1)
    input_ids = torch.randint(low, vocab_size, (batch, length), generator=generator)
    input_ids[input_ids == pad_token_id] = low if pad_token_id != low else low + 1
    lengths = torch.randint((length + 1) // 2, length + 1, (batch,), generator=generator)
    lengths[0] = length
    positions = torch.arange(length)
    attention_mask = (positions < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, pad_token_id)
    token_type_ids = ((positions >= (lengths[:, None] + 1) // 2) & attention_mask.bool()).long() if pairs else \
        torch.zeros_like(input_ids)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def export_onnx(source: str, out: str | Path, task: str | None = None, quantize: str | None = None,
                trust_remote_code: bool = False, overwrite: bool = False) -> dict:
    """Export the model in `source` (a folder or Hub repo id) to ONNX graphs in the new folder `out`, check each on
    ONNX Runtime against PyTorch and return the report written to `out/onnx_export.json`. `task` picks what is
    exported (see each model's `tasks(config)`); `quantize` (one of `QUANTIZATIONS`) also writes each graph
    quantized (`quantized_file`) with its measured errors. Nothing is left in `out` unless every graph passes its
    check."""
    require_onnx()
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise HfExtError(f"unknown quantization {quantize!r} (choose from {', '.join(QUANTIZATIONS)})")
    check_output_dir(out, overwrite)
    config = load_config(source, trust_remote_code=trust_remote_code)
    module = exporter_for(config.model_type, source)
    task = resolve_task(module, config, task, source)
    files = model_files(source)
    plan = module.plan(source, config, task, trust_remote_code)
    model = plan.model.eval()
    started = time.perf_counter()
    report = {"source": model_name(source), "model_type": config.model_type, "task": task, "opset": OPSET,
              "float_tolerance": FLOAT_TOLERANCE, "quantization": quantize, "notes": plan.notes,
              "versions": _versions(), "graphs": []}
    with atomic_output_dir(out, overwrite) as staging:
        for graph in plan.graphs:
            path = staging / f"{graph.name}.onnx"
            logger.info(f"exporting {path.name} ({', '.join(graph.input_names)} -> {', '.join(graph.output_names)})")
            export_graph(graph, path)
            entry = {"file": path.name, "inputs": graph.input_names, "outputs": graph.output_names,
                     "dynamic_axes": {name: {str(axis): dim for axis, dim in axes.items()}
                                      for name, axes in graph.dynamic_axes.items()},
                     "checks": check_graph(graph, path, FLOAT_TOLERANCE)}
            logger.info(f"checked {path.name} on ONNX Runtime: max abs error "
                        f"{max(check['max_abs_error'] for check in entry['checks']):.2e} over "
                        f"{len(entry['checks'])} shapes")
            if quantize is not None:
                quantized = staging / quantized_file(graph.name, quantize)
                quantize_graph(path, quantized, quantize)
                entry[quantize] = {"file": quantized.name, "checks": check_graph(graph, quantized, None)}
                logger.info(f"wrote {quantized.name}: max abs error "
                            f"{max(check['max_abs_error'] for check in entry[quantize]['checks']):.2e}")
            report["graphs"].append(entry)
        copy_model_files(files, staging, model)
        report["seconds"] = round(time.perf_counter() - started, 1)
        (staging / REPORT_NAME).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        write_export_card(staging, report)
    return report


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__}


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's own chatter (warnings, notices about optional torchvision ops) off: the export reports what
    matters itself, and a failure still raises."""
    # torch.onnx logs through its own logger, onnxruntime's quantization through the root logger
    loggers = [pylogging.getLogger("torch.onnx"), pylogging.getLogger()]
    levels = [logger.level for logger in loggers]
    for quieted in loggers:
        quieted.setLevel(pylogging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        for quieted, level in zip(loggers, levels, strict=True):
            quieted.setLevel(level)


def export_graph(graph: OnnxGraph, path: Path) -> None:
    """`torch.onnx.export` (dynamo) of one graph at its export shape, with its dynamic axes."""
    inputs = graph.make_inputs(graph.export_dims, torch.Generator().manual_seed(0))
    dims: dict[str, torch.export.Dim] = {}
    # per input its {axis: Dim} (None: static), the inputs of `*args` together in one tuple
    dynamic_shapes: tuple[Any, ...] = tuple({axis: dims.setdefault(dim, torch.export.Dim(dim))
                            for axis, dim in graph.dynamic_axes.get(name, {}).items()} or None
                           for name in graph.input_names)
    parameters = list(inspect.signature(graph.module.forward).parameters.values())
    varargs = [index for index, parameter in enumerate(parameters) if parameter.kind is parameter.VAR_POSITIONAL]
    if varargs:  # torch.export sees `*args` as one tuple argument
        dynamic_shapes = (*dynamic_shapes[:varargs[0]], dynamic_shapes[varargs[0]:])
    try:
        with _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(graph.module, tuple(inputs[name] for name in graph.input_names),
                                        dynamo=True, opset_version=OPSET, input_names=graph.input_names,
                                        output_names=graph.output_names, dynamic_shapes=dynamic_shapes,
                                        verbose=False, report=False)
            assert program is not None  # the dynamo exporter returns the program it built
            program.save(str(path))
    except Exception as error:  # noqa: BLE001 - the exporter raises many kinds; the user needs one line
        raise HfExtError(f"exporting {path.name} failed: {export_failure(error)}") from error


def export_failure(error: BaseException) -> str:
    """The line of an exporter's error that says what failed: torch.onnx wraps the cause in pages of advice, with
    the cause under '## Exception summary'."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    if "## Exception summary" in lines[:-1]:
        return lines[lines.index("## Exception summary") + 1]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def session(path: str | Path) -> "onnxruntime.InferenceSession":
    """An ONNX Runtime CPU session for one graph file."""
    import onnxruntime

    with loading("an ONNX graph", path):
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_session(ort_session: "onnxruntime.InferenceSession", inputs: Inputs,
                input_names: list[str]) -> list[np.ndarray]:
    """Run a session on the named inputs (torch tensors), returning numpy outputs in the graph's order."""
    graph_inputs = {node.name for node in ort_session.get_inputs()}
    return ort_session.run(None, {name: inputs[name].numpy() for name in input_names if name in graph_inputs})


def check_graph(graph: OnnxGraph, path: Path, tolerance: float | None) -> list[dict]:
    """Run `path` on ONNX Runtime and `graph.module` in PyTorch on the same inputs, at every shape of
    `graph.check_dims`: per shape, the max abs error of each output and the argmax agreement of the label outputs.
    With a `tolerance` (float graphs), an error above it times the output's largest magnitude (at least 1) fails the
    export."""
    ort_session = session(path)
    checks = []
    for index, dims in enumerate(graph.check_dims):
        inputs = graph.make_inputs(dims, torch.Generator().manual_seed(index + 1))
        with torch.no_grad():
            expected = graph.module(*(inputs[name] for name in graph.input_names))
        actual = run_session(ort_session, inputs, graph.input_names)
        errors, scales, agreement = {}, {}, {}
        for name, want, got in zip(graph.output_names, expected, actual, strict=True):
            if tuple(want.shape) != tuple(got.shape):
                raise HfExtError(f"{path.name}: output {name} has shape {tuple(got.shape)} on ONNX Runtime, "
                                 f"{tuple(want.shape)} in PyTorch (inputs {dims})")
            want = want.float().numpy()
            errors[name] = float(np.abs(want - got).max()) if want.size else 0.0
            scales[name] = max(1.0, float(np.abs(want).max())) if want.size else 1.0
            if name in graph.label_outputs:
                agreement[name] = float((want.argmax(-1) == got.argmax(-1)).mean())
        max_abs_error = max(errors.values())
        check = {"dims": dims, "max_abs_error": max_abs_error, "errors": errors}
        if agreement:
            check["argmax_agreement"] = agreement
        # float32 rounding grows with the values: the tolerance holds per unit of an output's largest magnitude
        # (a 30-layer pretrained decoder's logits reach tens)
        over = [name for name in errors if tolerance is not None and errors[name] > tolerance * scales[name]]
        if over:
            worst = max(over, key=lambda name: errors[name] / scales[name])
            raise HfExtError(f"{path.name}: ONNX Runtime's {worst} differs from PyTorch by {errors[worst]:.2e} "
                             f"(more than {tolerance:g} x its largest magnitude, {scales[worst]:.3g}) at {dims}")
        checks.append(check)
    return checks


def quantized_file(graph_name: str, scheme: str) -> str:
    """The file name of a graph quantized with `scheme` (`decoder_int8.onnx`, `model_int8_dynamic.onnx`)."""
    return f"{graph_name}_{scheme.replace('-', '_')}.onnx"


def quantize_graph(path: Path, quantized: Path, scheme: str) -> None:
    """`path` quantized with one of `QUANTIZATIONS` into `quantized`. ONNX Runtime's pre-processing runs first: it
    folds the `Transpose` of a weight that the exporter leaves in front of a MatMul (a head tied to the token
    embeddings reads the embedding matrix transposed), so that MatMul's weight becomes a constant the quantizers
    take; without it the head, the largest matrix of a decoder, stays float."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = quantized.with_name(f"{quantized.stem}_prepared.onnx")
    try:
        with _quiet_exporter():
            # the symbolic shape inference is for transformers' own fusions; the graph has its shapes from the export
            quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
            if scheme == "int8-dynamic":
                quantize_dynamic_int8(prepared, quantized)
            else:
                quantize_matmul_nbits(prepared, quantized, bits={"int8": 8, "int4": 4}[scheme])
    finally:
        prepared.unlink(missing_ok=True)


def quantize_dynamic_int8(path: Path, quantized: Path) -> None:
    """Dynamic int8 quantization of the weights of MatMul and Gemm nodes (activations quantized at run time), as
    ONNX Runtime recommends for transformers on CPU, one scale per output channel."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"],
                     per_channel=True)


def quantize_matmul_nbits(path: Path, quantized: Path, bits: int, accuracy_level: int = ACCURACY_LEVEL,
                          block_size: int = BLOCK_SIZE) -> None:
    """The constant weights of MatMul and Gemm nodes as `bits`-bit integers: ONNX Runtime's `MatMulNBits` (symmetric
    blocks of `block_size` along the input, one float scale each), whose kernel reads the packed weights; at
    `accuracy_level` 4 it quantizes each row of activations in blocks as it multiplies (int8 arithmetic), at 0 it
    computes in float32. `MatMulNBitsQuantizer` takes MatMul only: a Gemm (the exporter's form of GPT-2's `Conv1D`,
    `x @ W + b` on 2-D `x`) becomes MatMul + Add first (its own `ONNXModel.replace_gemm_with_matmul`)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(path)), bits=bits, block_size=block_size, is_symmetric=True,
                                     accuracy_level=accuracy_level)
    quantizer.model.replace_gemm_with_matmul()
    quantizer.process()
    quantizer.model.save_model_to_file(str(quantized), use_external_data_format=False)


def model_files(source: str) -> list[tuple[Path, Path]]:
    """`(path in the folder, file to read)` of the source's config, tokenizer or processor files (subfolders included,
    e.g. Optimus' decoder tokenizer) and model code: everything but weights, which the export folder holds so that it
    loads its tokenizer and config like the model folder did. A Hub id is read from the local cache. A link is
    followed only inside the folder or the Hub cache (`hub.checked_link_target`), and checked before any work."""
    folder = Path(source)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        with loading("the model files", source):
            folder = Path(snapshot_download(source, allow_patterns=[f"*{suffix}" for suffix in COPIED_SUFFIXES]))
    roots = link_roots(folder)
    files = []
    for file in sorted(folder.rglob("*")):
        relative = file.relative_to(folder)
        if (file.is_file() and file.suffix in COPIED_SUFFIXES and file.name not in NOT_COPIED
                and not any(part.startswith(".") for part in relative.parts)):
            files.append((relative, checked_link_target(file, roots)))
    return files


def copy_model_files(files: list[tuple[Path, Path]], staging: Path, model: PreTrainedModel) -> None:
    """The `model_files` into the export folder, none more open than its source (`output.copy_file`), and the config
    the graphs were exported from (with the options given at load time)."""
    for relative, file in files:
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        copy_file(file, staging / relative)
    model.config.save_pretrained(staging)


def write_export_card(folder: Path, report: dict) -> None:
    """README.md of the export folder: what is in it and the checks, so that a pushed folder shows them."""
    write_model_card(folder, "onnx", card_data(tags=["onnx", report["model_type"]]), report=report,
                     tolerance=f"{FLOAT_TOLERANCE:g}")
