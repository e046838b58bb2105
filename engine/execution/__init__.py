"""Model execution over a KV cache: cached_model.py (a model run over a cache of its own),
static_kv.py (the static, captured and compiled paths), step_store.py (compiled steps kept on
disk) and placement.py (device maps). It imports engine.core and engine.kernels."""
