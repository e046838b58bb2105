"""Measuring: interleaved benchmarks against generate() (interleaved.py), the alpha* timing
(optimal.py) and the GPU benchmark of scripts/gpu_check.sh (gpu.py)."""
