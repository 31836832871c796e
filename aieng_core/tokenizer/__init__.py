"""The byte-level BPE tokenizer: training, saving in Hugging Face layout, loading."""
