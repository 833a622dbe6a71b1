"""Converters from the original research checkpoints. Each module offers `add_arguments(parser)` and `run(args)`
for `hf-ext convert <model>` and the matching script in `conversion/`."""

CONVERTERS = {
    "optimus": ("hf_ext.conversion.optimus", "original Optimus checkpoints (ChunyuanLI/Optimus)"),
    "ernie2": ("hf_ext.conversion.ernie2", "ERNIE 2.0 PaddlePaddle checkpoints (static release or PaddleNLP), "
               "without paddle"),
    "mtdnn": ("hf_ext.conversion.mtdnn", "original MT-DNN checkpoints (namisan/mt-dnn)"),
    "universal-transformer": ("hf_ext.conversion.universal_transformer", "Universal Transformer checkpoints of the "
                              "PyTorch re-implementation (andreamad8/Universal-Transformer-Pytorch)"),
}
