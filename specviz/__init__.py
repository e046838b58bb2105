"""specviz: a Gradio visual debugger for the engine's speculative decoding traces.

build_demo() returns the app; launch_options() holds the css/theme keyword arguments that
Gradio 6 takes in launch().
"""

from __future__ import annotations

from specviz.ui import build_demo, launch_options

__all__ = ["build_demo", "launch_options"]
