"""The picker: its prompt/output format, its training examples and inference."""
