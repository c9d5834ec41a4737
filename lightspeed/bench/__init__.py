"""``lightspeed bench``: tokens/s against the machine's own read-bandwidth limit and against peers.

    from lightspeed.bench import BenchOptions, run_bench
    report = run_bench(BenchOptions(quant="q8_0", threads=2, peers=True))
    report["decode_tokens_per_s"], report["percent_of_limit"], report["peers"]["llama.cpp"]

Decode reads every weight once per token, so tokens/s can be at most the streaming read
bandwidth divided by the bytes of weights per token. The bandwidth is measured in the same
run by ``probe.c`` (a buffer that size, all threads). See ``runner`` for the procedure and
``benchmarks/README.md`` for how to run it and the latest figures.
"""
from .machine import PeakRSS, cpu_features, cpu_name, machine_summary
from .probe import Bandwidth, measure_read_bandwidth
from .report import format_text, plot
from .runner import BenchOptions, run_bench, weight_bytes_per_token

__all__ = ["BenchOptions", "run_bench", "weight_bytes_per_token", "measure_read_bandwidth", "Bandwidth",
           "format_text", "plot", "PeakRSS", "cpu_name", "cpu_features", "machine_summary"]
