"""Training the early-exit drafter's extra layer and its Cali-TS predictor (EESD §3.1-3.3).

- :mod:`engine.training.config`: the typed run configuration (no torch import).
- :mod:`engine.training.data`: target-generated sequences and cached hidden states.
- :mod:`engine.training.losses`: the objectives (CE, WordKD, TVDKD, SeqKD, AtSpeed-S/R).
- :mod:`engine.training.drafter`: Transformer^e over cached states, held-out evaluation.
- :mod:`engine.training.predictor`: the Cali-TS predictor theta_M for one drafter.
- :mod:`engine.training.run`: the whole run (``python -m engine train-draft``).
"""
