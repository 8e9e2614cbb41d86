"""RL: DeepSpeed learners (GRPO lands here)."""
