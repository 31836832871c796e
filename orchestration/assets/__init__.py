"""The assets of the graph, one module per group, each with the checks that guard its assets
beside them (as dagster-open-platform keeps them); definitions.py assembles them."""
