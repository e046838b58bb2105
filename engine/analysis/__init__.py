"""What a finished run's trace tells beyond its rounds: its timeline for any trace viewer
(timeline.py: Chrome trace-event JSON, Perfetto's UI opens it)."""
