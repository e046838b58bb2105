"""Beam search and beam sampling as pure step functions (search.py, sample.py) and the match
of a round's drafted beams against the target's top-K (match.py); no model."""
