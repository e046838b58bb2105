"""Draft-length controllers: the entry point every caller imports (controllers.py), their one
parameter declaration and typed config (config.py), the Controller interface and its round
bookkeeping (recorder.py), the fixed, heuristic and confidence controllers (length.py),
Beta-TS and Cali-TS (thompson.py), the cost-aware switch (cost.py, pure), its timed guard
(guard.py, pure) and its controller (cost_controller.py), the posterior math (posterior.py)
and the Cali-TS predictor (predictor.py)."""
