#!/usr/bin/env python
"""Maintained weight-only quantization libraries for PyTorch on the CPU, on one layer: a float32
`nn.Linear(768, 3072)` (a GPT-2 small MLP projection, random weights) quantized to int8 and, where the library has
them, 4-bit weights; a batch-1 forward (input [1, 1, 768]) timed interleaved against the float32 layer.

Candidates, each a copy of the same float32 layer:
- `pytorch dynamic int8`: `torch.ao.quantization.quantize_dynamic` (int8 weights, activations quantized at run
  time), what `quantize_decoder` uses (docs/export.md); always present, the reference;
- `optimum-quanto int8` / `int4`: `quantize(weights=qint8 / qint4)` then `freeze`;
- `bitsandbytes int8` / `nf4`: its CPU backend, `Linear8bitLt` (threshold 0: no outlier columns kept float) and
  `Linear4bit` (`nf4`, float32 compute);
- `hqq int8` / `int4`: `HQQLinear`, groups of 64, float32 compute;
- torchao: `Int8WeightOnlyConfig` (int8 weights).
A library that does not import is recorded as not installed, with its pip name; none is a dependency of hf-ext.
Results: float32 time / quantized time (the speed-up; under 1 is slower), no target, and each candidate's maximum
absolute output difference against float32's.
"""

import copy
import importlib
import importlib.metadata
import logging
import warnings
from collections.abc import Callable

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved
from torch import nn

IN_FEATURES, OUT_FEATURES = 768, 3072
GROUP_SIZE = 64  # HQQ's groups


def dynamic_int8(layer: nn.Linear) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return torch.ao.quantization.quantize_dynamic(nn.Sequential(layer), {nn.Linear}, dtype=torch.qint8)


def quanto(bits: int) -> Callable[[nn.Linear], nn.Module]:
    def build(layer):
        from optimum.quanto import freeze, qint4, qint8, quantize

        model = nn.Sequential(layer)  # quantize() replaces a module's children
        quantize(model, weights=qint8 if bits == 8 else qint4)
        freeze(model)
        return model
    return build


def bitsandbytes_int8(layer: nn.Linear) -> nn.Module:
    import bitsandbytes

    # it logs at every call that float32 inputs are cast to float16: its design, not a result
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    quantized = bitsandbytes.nn.Linear8bitLt(IN_FEATURES, OUT_FEATURES, has_fp16_weights=False, threshold=0.0)
    quantized.weight = bitsandbytes.nn.Int8Params(layer.weight.data, requires_grad=False, has_fp16_weights=False)
    quantized.bias = nn.Parameter(layer.bias.data, requires_grad=False)
    return quantized.to("cpu")  # quantizes the weight


def bitsandbytes_nf4(layer: nn.Linear) -> nn.Module:
    import bitsandbytes

    quantized = bitsandbytes.nn.Linear4bit(IN_FEATURES, OUT_FEATURES, compute_dtype=torch.float32, quant_type="nf4")
    quantized.weight = bitsandbytes.nn.Params4bit(layer.weight.data, requires_grad=False, quant_type="nf4")
    quantized.bias = nn.Parameter(layer.bias.data, requires_grad=False)
    return quantized.to("cpu")  # quantizes the weight


def hqq(bits: int) -> Callable[[nn.Linear], nn.Module]:
    def build(layer):
        from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

        return HQQLinear(layer, quant_config=BaseQuantizeConfig(nbits=bits, group_size=GROUP_SIZE),
                         compute_dtype=torch.float32, device="cpu")
    return build


def torchao_int8(layer: nn.Linear) -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = nn.Sequential(layer)
    quantize_(model, Int8WeightOnlyConfig())
    return model


# library (its name on the index) -> (its module, {candidate: the function quantizing a float32 copy of the layer})
LIBRARIES: dict[str, tuple[str, dict[str, Callable[[nn.Linear], nn.Module]]]] = {
    "optimum-quanto": ("optimum.quanto", {"optimum-quanto int8": quanto(8), "optimum-quanto int4": quanto(4)}),
    "bitsandbytes": ("bitsandbytes", {"bitsandbytes int8": bitsandbytes_int8, "bitsandbytes nf4": bitsandbytes_nf4}),
    "hqq": ("hqq.core.quantize", {"hqq int8": hqq(8), "hqq int4": hqq(4)}),
    "torchao": ("torchao.quantization", {"torchao int8": torchao_int8}),
}


def repeated(module: nn.Module, inputs: torch.Tensor, calls: int) -> Callable[[], None]:
    """One timed run: `calls` forwards (one takes well under a millisecond)."""
    @torch.no_grad()
    def run():
        for _ in range(calls):
            module(inputs)
    return run


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--calls", type=int, help="forwards per timed run (default 2000; quick 5)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=7)
    calls = args.calls or (5 if args.quick else 2000)
    torch.manual_seed(0)
    layer = nn.Linear(IN_FEATURES, OUT_FEATURES).eval()
    inputs = torch.randn(1, 1, IN_FEATURES)
    with torch.no_grad():
        expected = layer(inputs)

    builders = {"pytorch dynamic int8": dynamic_int8}
    libraries = {"torch": torch.__version__}
    for library in LIBRARIES:
        module, candidates = LIBRARIES[library]
        try:
            importlib.import_module(module)
        except ImportError:
            libraries[library] = f"not installed (pip install {library})"
        else:
            builders.update(candidates)
            libraries[library] = importlib.metadata.version(library)
        print(f"{library}: {libraries[library]}")
    record("libraries", libraries)

    quantized = {name: build(copy.deepcopy(layer)).eval() for name, build in builders.items()}
    difference = {}
    with torch.no_grad():
        for name, module in quantized.items():
            difference[name] = (module(inputs) - expected).abs().max().item()
            print(f"  {name}: max abs difference from float32 {difference[name]:.4g}")
    record("max_abs_output_difference_from_float32", difference)
    record("max_abs_float32_output", expected.abs().max().item())

    candidates = {"float32": repeated(layer, inputs, calls),
                  **{name: repeated(module, inputs, calls) for name, module in quantized.items()}}
    times = time_interleaved(candidates, repeats,
                             section=f"Linear({IN_FEATURES}, {OUT_FEATURES}), batch 1, {calls} forwards per run")
    for name in quantized:
        report_ratio(f"speed-up of {name} (float32 time / its time)", times["float32"], times[name],
                     higher_is_better=True)
    finish()


if __name__ == "__main__":
    main()
