"""The data half of the graph: landing, decoding, the data contract, cleaning, quarantine."""
