"""Training the early-exit drafter's extra layer and its Cali-TS predictor (EESD §3.1-3.3),
and the feature drafter (EAGLE).

- :mod:`engine.training.config`: the typed run configuration (no torch import).
- :mod:`engine.training.data`: target-generated sequences and cached hidden states.
- :mod:`engine.training.losses`: the objectives (CE, WordKD, TVDKD, SeqKD, AtSpeed-S/R).
- :mod:`engine.training.drafter`: Transformer^e over cached states, held-out evaluation.
- :mod:`engine.training.predictor`: the Cali-TS predictor theta_M for one drafter.
- :mod:`engine.training.run`: the whole run (``python -m engine train-draft``).
- :mod:`engine.training.feature`: the feature drafter's loss, training loop and checkpoints
  (``python -m engine train-feature``), over :mod:`engine.training.feature_data` (token
  shards and the target's cached features), evaluated by
  :mod:`engine.training.feature_eval` (held-out chains), on data from
  :mod:`engine.training.selfgen` (the target's own continuations).
- :mod:`engine.training.batches`: token-budget batches and the held-out split, shared by
  both trainers.
"""
