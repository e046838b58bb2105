"""specviz: a Gradio visual debugger for the engine's speculative decoding traces.

build_demo() returns the app; launch_options() holds the keyword arguments of launch(): css
and theme (Gradio 6 takes them there), the upload cap and the number of sessions kept.
"""

from __future__ import annotations

from specviz.ui import build_demo, launch_options

__all__ = ["build_demo", "launch_options"]
