"""Who proposes q: the drafter interface, the declaration of a drafter kind and a separate
draft model (base.py), the registry of kinds (registry.py), the early exit (early_exit.py)
and its cache shared with the target (shared.py), the n-gram lookup (ngram.py), the feature
drafter (feature.py), their hybrid (hybrid.py) and the suffix drafter (suffix.py)."""
