"""Holds the `optimus_lm` metric script (makes the folder a package so that the script ships with hf-ext); load it
with `hf_ext.metrics.load_metric("optimus_lm")` rather than importing it."""
