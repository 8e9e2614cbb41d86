"""Offline evidence mining: minimal sufficient passage sets (the paper's Algorithm 1)."""
