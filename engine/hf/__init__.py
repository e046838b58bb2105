"""transformers' own speculative engines (assisted generation), recorded as specviz traces."""
