"""The engine-to-UI contract: trace.py (a run's rounds as the UI and the analyses read them,
JSON on disk) and records.py (the typed records a round carries). It imports only
engine.core."""
