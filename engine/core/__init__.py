"""The ground floor every engine package shares, the engine's vocabulary (it imports no other
engine package): errors.py, config.py (parameter rows and configs), sampling.py, forest.py,
eos.py (EOS ids), paths.py, machine.py (machine class, code version) and weights.py (weight
files). docs/ARCHITECTURE.md has a row per module.

Importing it fixes inductor's on-disk cache folder (paths.keep_inductor_cache) before any
op registration asks for it: every module that registers an op (engine.kernels) imports this
package first."""

from engine.core.paths import keep_inductor_cache

keep_inductor_cache()
