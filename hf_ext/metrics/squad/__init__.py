"""Holds the `squad` metric script (makes the folder a package so that the script ships with hf-ext); load it with
`hf_ext.metrics.load_metric("squad", config_name="v2")` or `evaluate.load(metric_path("squad"))` rather than importing
it."""
