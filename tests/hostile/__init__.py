"""Hostile landed files: a test-side generator of inputs that have broken data pipelines,
each with the exact outcome the reader spec promises for it."""
