"""ctxpick: train and serve a context picker for retrieval-augmented generation."""

__version__ = "0.1.0"
