"""The dataset version: which tokenized partitions, with which tokenizer, split how."""
