"""Holds the `glue` metric script (makes the folder a package so that the script ships with hf-ext); load it with
`hf_ext.metrics.load_metric("glue", config_name="mrpc")` or `evaluate.load(metric_path("glue"), "mrpc")` rather than
importing it."""
