"""The ground floor every engine package shares (it imports no other engine package): the
vocabulary (errors.py, config.py: parameter rows and configs, sampling.py, forest.py, eos.py:
EOS ids, paths.py, weights.py: weight files), the engine-to-UI contract (trace.py and its
records.py), model execution over a KV cache (cached_model.py; static_kv.py: the static,
captured and compiled paths; placement.py: device maps) and the CPU numerics of packed
targets (packed4.py: the GGUF's 4-bit layers, qmm.py and rowattn.py with their C++ ops,
eager_bits.py: the eager step's bits in a compiled one, attention.py, layout.py, threads.py:
the thread rule). docs/ARCHITECTURE.md has a row per module.

Importing it fixes inductor's on-disk cache folder (paths.keep_inductor_cache) before any
op registration asks for it."""

from engine.core.paths import keep_inductor_cache

keep_inductor_cache()
