"""Holds the `seqeval` metric script (makes the folder a package so that the script ships with hf-ext); load it with
`hf_ext.metrics.load_metric("seqeval")` or `evaluate.load(metric_path("seqeval"))` rather than importing it."""
