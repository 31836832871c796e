"""Training the language model from scratch on the dataset manifest's token streams."""
