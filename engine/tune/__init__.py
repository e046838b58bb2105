"""The tuner: a model pair's best exact settings per method (engine.tune.space: what is tried;
engine.tune.search: successive halving within a budget, the held-out report), stored as the
pair's tuned settings (engine.run.tuned)."""
