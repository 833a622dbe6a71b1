"""Holds the `algorithmic_accuracy` metric script (makes the folder a package so that the script ships with hf-ext);
load it with `hf_ext.metrics.load_metric("algorithmic_accuracy")` rather than importing it."""
