"""Hydra finds ctxpick's Ray launcher here (plugins live in the hydra_plugins namespace)."""
