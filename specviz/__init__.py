"""specviz: a Gradio visual debugger for the engine's speculative decoding traces.

build_demo() returns the app; launch_options() holds the keyword arguments of launch(): css
and theme (Gradio 6 takes them there), the upload cap and the number of sessions kept.

One job a module (docs/ARCHITECTURE.md has a row each): ui (the tabs around the session
state) and wiring (what the tabs share); the tabs, each laid out and wired by its own module:
debugger_tab with hindsight_panel, compare_tab, bench_tab with tune_tab, check_tab; their
handlers: callbacks (the Debugger's), compare; the model work: worker (the one model
thread), pairs (the pair cache), warmup (compiled steps), limits (the app's caps), streaming
(a decode round by round), jobs (the runner of Bench, Tune and Check), zerogpu; hosting (the
SPECVIZ_* settings); the views: render, state, params, figures, forest_view, charts,
text_view, round_panel, diagnosis_view; files: trace_file, share_page, record (the demo
trace); bench (the UI's latency benchmark).
"""

from __future__ import annotations

from specviz.ui import build_demo, launch_options

__all__ = ["build_demo", "launch_options"]
