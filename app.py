"""specviz app: read the hosting settings, build the Gradio demo, launch.

Settings come from the SPECVIZ_* variables (specviz/hosting.py, the one reader); this
script's flags override them. Models load lazily on the first Run (or at start with
--preload), once per process. On ZeroGPU (SPACES_ZERO_GPU) every allowed pair loads at start
and only spaces.GPU functions compute (specviz/zerogpu.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from the app
if importlib.util.find_spec("spaces") is not None:
    import spaces  # noqa: F401  - before torch: ZeroGPU patches CUDA (a no-op elsewhere)

import specviz  # noqa: E402
from engine.cli.flags import OneLineParser  # noqa: E402
from engine.core.errors import SpecvizError  # noqa: E402
from engine.drafters.registry import draft_help  # noqa: E402
from engine.run.models import resolve_device  # noqa: E402
from specviz import hosting, pairs, warmup, zerogpu  # noqa: E402
from specviz.hosting import DEVICES, DTYPES, HostConfig  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = OneLineParser(description="specviz: speculative decoding visual debugger; "
                                 "flags override the SPECVIZ_* variables")
    ap.add_argument("--target", help="target model: embedded-q4:a8 (the CPU default, the GGUF "
                    "as shipped), embedded (fp32; the CUDA default), embedded-q4, hub id, dir "
                    "($SPECVIZ_TARGET)")
    ap.add_argument("--draft", help=f"draft spec: {draft_help(' | ')} | hub id | dir; "
                    "empty: the target's default (the embedded models: ngram+feature, "
                    "others: their early exit) ($SPECVIZ_DRAFT)")
    ap.add_argument("--device", choices=DEVICES, help="$SPECVIZ_DEVICE (default auto)")
    ap.add_argument("--dtype", choices=DTYPES, help="$SPECVIZ_DTYPE (default auto)")
    ap.add_argument("--presets", help="preset ids offered, comma-separated, or all "
                    "($SPECVIZ_PRESETS)")
    ap.add_argument("--allow-custom-models", type=int, choices=(0, 1),
                    help="1: users may type model specs; 0: presets only "
                    "($SPECVIZ_ALLOW_CUSTOM_MODELS)")
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                    help="server name (a Space sets GRADIO_SERVER_NAME=0.0.0.0)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    ap.add_argument("--preload", action="store_true", help="load the model pair at start")
    ap.add_argument("--no-demo-trace", action="store_true", help="start without the demo trace")
    return ap.parse_args(argv)


def host_config(args: argparse.Namespace) -> HostConfig:
    """The variables, overridden by the flags that were given, validated."""
    custom = None if args.allow_custom_models is None else bool(args.allow_custom_models)
    return HostConfig.from_env(os.environ).with_overrides(
        target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
        presets=args.presets, allow_custom_models=custom).check()


def log_to_stderr() -> None:
    """The app's own log lines (the 'specviz' logger: loads, the step warm-up) on stderr at
    INFO, with a time stamp; other libraries keep their levels."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s specviz: %(message)s", "%H:%M:%S"))
    log = logging.getLogger("specviz")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log_to_stderr()
    try:
        host = host_config(args)
        hosting.configure(host)
        if not host.zero_gpu and resolve_device(host.device).type == "cpu":
            warmup.serve_compiled()  # packed targets: compiled steps, warmed when idle
        if host.zero_gpu:
            zerogpu.install()
            zerogpu.preload_all()  # module scope on ZeroGPU: weights to CUDA once, here
        elif args.preload:
            pairs.preload(host.target, host.draft)
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    demo = specviz.build_demo(host.target, host.draft, demo_trace=not args.no_demo_trace)
    demo.queue(default_concurrency_limit=None).launch(
        server_name=args.host, server_port=args.port, share=args.share,
        **specviz.launch_options())


if __name__ == "__main__":
    main()
