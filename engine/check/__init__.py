"""The exactness check of one method on one prompt and pair: run.py (run_check), runs.py (the
temperature-0 and the in-law checks), laws.py (the exact laws), stats.py (chi-square, power),
result.py (what a check is asked and answers)."""
