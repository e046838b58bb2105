"""Pure verification rules: token level (token.py), beam level (beam.py), exact enumeration of a
rule's random choices (enumerate.py), Hu et al.'s optimal acceptance alpha* (optimal.py) and
its per-position records (optimality.py)."""
