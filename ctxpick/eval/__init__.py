"""Evaluation: pipelines over datasets, baselines, reports."""
