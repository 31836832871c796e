"""The renderers of the generated reference pages (scripts/docs_reference.py runs them)."""
