"""The ground floor every engine package shares (it imports no other engine package): the
vocabulary (errors, configs, sampling, the forest, EOS ids, paths, weight files), the
engine-to-UI contract (the trace and its records), model execution over a KV cache (the
cached model, the static / captured / compiled paths, device placement) and the CPU numerics
of packed targets (qmm, rowattn, their C++ ops, the eager-bits ops, the attention, the layout,
the thread rule). docs/ARCHITECTURE.md has a row per module.

Importing it fixes inductor's on-disk cache folder (paths.keep_inductor_cache) before any
op registration asks for it."""

from engine.core.paths import keep_inductor_cache

keep_inductor_cache()
