"""The models of hf-ext, one package each (docs/adding_a_model.md lists what a package holds).

In each package, `configuration_*`, `modeling_*` and `processing_*` import only torch, transformers and their own
folder, since they are pushed to the Hub as remote code; the package's other modules (conversion, training, data,
commands, samples) build on the shared layer in `hf_ext/`. No package imports another."""

MODELS = ("optimus", "universal_transformer", "mtdnn", "ernie2")  # the one list of the models
