"""Generation engines (vLLM in Ray actors) and the models they load."""
