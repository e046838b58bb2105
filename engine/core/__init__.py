"""The round loop and what every method shares: the API (api.py), the loop (loop.py), the
forest and its attention inputs, the cached model, traces, configs, sampling, model loading,
the cost model, the CPU layout and the thread rule."""
