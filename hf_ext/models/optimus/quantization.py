"""int8 or 4-bit weights for Optimus' decoder in PyTorch (`quantize_decoder`, `OptimusLatentSpace.from_pretrained(...,
quantize="int8")`, `hf-ext optimus ... --quantize int8|nf4`).

Greedy decoding at batch 1 reads every decoder weight once per token, so its speed follows the bytes of the weights.
The decoder's projections and its LM head become PyTorch's dynamically quantized linear layers
(`torch.ao.quantization.quantize_dynamic`: int8 weights with one scale per tensor, each step's activations quantized
at run time, int8 matrix products from fbgemm/oneDNN); the encoder, the latent projections and the token embeddings
stay float (one pass per text, or one row per token). torchao's `Int8WeightOnlyConfig` was tried first: on a CPU
without `torch.compile` it dequantizes each weight at every call and decoded 3x slower than float32 (docs/export.md).
"nf4" puts the same layers in bitsandbytes' `Linear4bit` (4-bit NormalFloat weights, one scale per block of 64; the
`quantize` extra): its CPU backend repacks each weight on the first call in eval mode and multiplies with its own
kernel (benchmarks/bench_weight_only_libraries.py).

GPT-2's projections are transformers' `Conv1D` (a weight stored `[in, out]`), which no quantizer takes; they become
`nn.Linear` layers holding the transposed weight first (transformers and peft have no public helper for it)."""

import warnings

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D
from transformers.utils import logging

from ...errors import HfExtError
from ...extras import install_command
from .modeling_optimus import OptimusModel

logger = logging.get_logger(__name__)

QUANTIZATIONS = ("int8", "nf4")
# Linear4bit's compute dtype: float32 and bfloat16 decoded GPT-2 small equally fast on an AVX512-BF16 CPU (its kernel
# multiplies in bfloat16 either way); float32 keeps the layers' inputs and outputs in the model's float32
NF4_COMPUTE_DTYPE = torch.float32
# bitsandbytes' CPU kernel packs a weight's rows in blocks of 32 (`_convert_weight_packed_for_cpu`, which asserts it);
# a layer with another number of outputs (the head of a vocabulary such as GPT-2's 50257 + 3) stays float
NF4_ROW_BLOCK = 32


def check_quantization(scheme: str) -> None:
    """One error line for a scheme `quantize_decoder` does not know."""
    if scheme not in QUANTIZATIONS:
        raise HfExtError(f"unknown quantization {scheme!r} (choose from {', '.join(QUANTIZATIONS)})")


def linear_from_conv1d(layer: Conv1D) -> nn.Linear:
    """An `nn.Linear` computing what `layer` computes: the same weight, transposed to `[out, in]`."""
    linear = nn.Linear(layer.nx, layer.nf, bias=layer.bias is not None, device=layer.weight.device,
                       dtype=layer.weight.dtype)
    linear.weight = nn.Parameter(layer.weight.detach().t().contiguous(), requires_grad=False)
    if layer.bias is not None:
        linear.bias = nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
    return linear


def replace_conv1d(module: nn.Module) -> int:
    """Every `Conv1D` below `module` replaced by its `nn.Linear`; returns how many."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                setattr(parent, name, linear_from_conv1d(child))
                replaced += 1
    return replaced


def nf4_linear(layer: nn.Linear) -> nn.Module:
    """bitsandbytes' `Linear4bit` holding `layer`'s weight in nf4 (quantized as it is moved to the CPU)."""
    import bitsandbytes

    quantized = bitsandbytes.nn.Linear4bit(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                           compute_dtype=NF4_COMPUTE_DTYPE, quant_type="nf4")
    quantized.weight = bitsandbytes.nn.Params4bit(layer.weight.detach().clone(), requires_grad=False, quant_type="nf4")
    if layer.bias is not None:
        quantized.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)
    return quantized.to("cpu").eval()


def nf4_packable(layer: nn.Module) -> bool:
    return type(layer) is nn.Linear and layer.out_features % NF4_ROW_BLOCK == 0


def replace_linear_with_nf4(module: nn.Module) -> int:
    """Every `nn.Linear` below `module` that bitsandbytes' CPU kernel takes replaced by its `nf4_linear`; returns
    how many."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and nf4_packable(child):
                setattr(parent, name, nf4_linear(child))
                replaced += 1
    return replaced


def quantize_decoder(model: OptimusModel, scheme: str = "int8") -> OptimusModel:
    """`model` (in place, for inference on the CPU) with int8 ("int8") or nf4 ("nf4") weights in its decoder's
    projections and LM head; see the module docstring. Raises `HfExtError` for a model that is not an
    `OptimusModel`, an unknown scheme, a model off the CPU, a PyTorch without a quantized engine ("int8") or no
    bitsandbytes ("nf4")."""
    check_quantization(scheme)
    if not isinstance(model, OptimusModel):
        raise HfExtError(f"--quantize {scheme} applies to an Optimus model's decoder (OptimusModel), not to a "
                         f"{type(model).__name__}")
    if model.device.type != "cpu":
        raise HfExtError(f"--quantize {scheme} runs on the CPU; the model is on {model.device}")
    if scheme == "nf4":
        return _quantize_decoder_nf4(model)
    if torch.backends.quantized.engine == "none":
        raise HfExtError(f"--quantize {scheme} needs a PyTorch build with a quantized engine (fbgemm, x86 or "
                         f"qnnpack); this one has {', '.join(torch.backends.quantized.supported_engines)}")
    model.eval()
    converted = replace_conv1d(model.decoder)
    with warnings.catch_warnings():
        # torch marks its eager quantization deprecated in favour of torchao, whose CPU int8 path is slower (above)
        warnings.simplefilter("ignore")
        # the decoder's linear layers (by type: its embeddings stay float), then the head (by name)
        torch.ao.quantization.quantize_dynamic(model.decoder, {nn.Linear}, dtype=torch.qint8, inplace=True)
        torch.ao.quantization.quantize_dynamic(model, {"lm_head"}, dtype=torch.qint8, inplace=True)
    quantized = sum(isinstance(layer, torch.ao.nn.quantized.dynamic.Linear) for layer in model.modules())
    logger.info(f"int8 weights in {quantized} layers of the decoder and its LM head ({converted} Conv1D as Linear)")
    return model


def _quantize_decoder_nf4(model: OptimusModel) -> OptimusModel:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise HfExtError(f"--quantize nf4 needs bitsandbytes: {install_command('quantize')}") from None
    model.eval()
    converted = replace_conv1d(model.decoder)
    # the decoder's linear layers (its embeddings stay float), then the head (a copy: its weight is the embeddings')
    quantized = replace_linear_with_nf4(model.decoder)
    head = "float"
    if nf4_packable(model.lm_head):
        model.lm_head = nf4_linear(model.lm_head)
        head = "nf4"
    logger.info(f"nf4 weights in {quantized} layers of the decoder ({converted} Conv1D as Linear), a {head} LM head "
                f"(vocabulary {model.lm_head.out_features})")
    return model


def greedy_agreement(reference_logits: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                     pad_token_id: int) -> tuple[int, int]:
    """(equal, total): the teacher-forced positions where `logits` and `reference_logits` (`[batch, length, vocab]`,
    from the decoder input `labels`, `<BOS> ... <EOS>` right-padded) pick the same next token; a position counts
    where its next token is a real one (not padding)."""
    predicted = labels[:, 1:] != pad_token_id
    same = reference_logits[:, :-1].argmax(-1) == logits[:, :-1].argmax(-1)
    return int(same[predicted].sum()), int(predicted.sum())


__all__ = ["QUANTIZATIONS", "check_quantization", "greedy_agreement", "quantize_decoder"]
