"""Answer judges: deterministic rules now, an LLM judge and a cascade on top of them."""
