"""Command groups of the `hf-ext` CLI, one module per model, each with `register(subparsers)`."""
