"""specviz app: parse args, build the Gradio demo, launch.

Models load lazily on the first Run (or at start with --preload), once per process;
device auto-detection comes from engine.load_pair(device="auto"). On a ZeroGPU Space the
run functions are wrapped with spaces.GPU (see specviz/pairs.py).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from the app

import specviz  # noqa: E402
from specviz import pairs  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="specviz: speculative decoding visual debugger")
    ap.add_argument("--target", default="embedded", help="target model: embedded, hub id, dir")
    ap.add_argument("--draft", default="", help="draft model (empty: early-exit of the target)")
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                    help="server name (a Space sets GRADIO_SERVER_NAME=0.0.0.0)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    ap.add_argument("--preload", action="store_true", help="load the model pair at start")
    ap.add_argument("--no-demo-trace", action="store_true", help="start without the demo trace")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.preload:
        pairs.preload(args.target, args.draft)
    demo = specviz.build_demo(args.target, args.draft, demo_trace=not args.no_demo_trace)
    demo.queue(default_concurrency_limit=None).launch(
        server_name=args.host, server_port=args.port, share=args.share,
        **specviz.launch_options())


if __name__ == "__main__":
    main()
