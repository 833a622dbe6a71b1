"""Converters from the original research checkpoints. Each module offers `add_arguments(parser)` and `run(args)`
for `hf-ext convert <model>` and the matching script in `conversion/`."""

CONVERTERS = {
    "optimus": ("hf_ext.conversion.optimus", "original Optimus checkpoints (ChunyuanLI/Optimus)"),
}
