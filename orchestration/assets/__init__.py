"""Assets, one module per domain."""
