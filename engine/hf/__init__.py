"""transformers' own speculative engines (assisted generation), recorded as specviz traces
round by round (recorder.py)."""
