"""veloxy benchmark harness (see bench/README.md)."""
