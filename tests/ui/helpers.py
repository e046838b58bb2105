"""Launch the specviz app in-process on a free port (shared by the ui and e2e tests)."""

from __future__ import annotations

import socket

TINY = 'tiny:{"vocab_size": 64, "layers": 4}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(target: str = "", **kw):
    """(demo, url) of a launched app (target '': the host's default, as make app runs it);
    the caller closes demo."""
    import specviz
    from specviz.hosting import HOST

    target = target or HOST.config.target
    demo = specviz.build_demo(target=target, **kw)
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1",
                            server_port=free_port(), quiet=True, **specviz.launch_options())
    return demo, url
