"""Draft-length controllers (controllers.py), their posterior math (posterior.py) and the
Cali-TS predictor (predictor.py)."""
