"""What a finished run's trace tells beyond its rounds: its timeline for any trace viewer
(timeline.py: Chrome trace-event JSON, Perfetto's UI opens it) and hindsight replay
(hindsight.py, the API and ``python -m engine replay``): the pair the trace names
(source.py), the drafter's proposals from every committed prefix (proposals.py) and the
rounds, costs and clairvoyant bound of other settings (replay.py, pure); and why acceptance
is low (diagnosis.py: tested drafts by position, target entropy, q, token and source, one run
or a set's runs pooled; diagnosis_views.py: its figures and one-line suggestions)."""
