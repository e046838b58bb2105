"""Measuring: interleaved benchmarks against generate() (interleaved.py), the set benchmark
over a prompt set (set_runner.py: resumable rows; sets.py: reading and choosing prompts;
set_summary.py: the aggregation; report.py: the self-contained report.html), the alpha*
timing (optimal.py), the GPU benchmark of scripts/gpu_check.sh (gpu.py) and the GPU step
table (steps.py)."""
