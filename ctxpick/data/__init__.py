"""Data schema, upstream-format loaders and dataset statistics."""
