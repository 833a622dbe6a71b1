"""One folder per model; each imports only torch, transformers and its own files (it is pushed as remote code)."""
