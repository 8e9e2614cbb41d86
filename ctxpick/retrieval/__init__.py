"""Chunking, BM25 / dense retrieval and candidate pools."""
