"""Rewards for picker rollouts: set terms (coverage, redundancy margin, format) and the service."""
