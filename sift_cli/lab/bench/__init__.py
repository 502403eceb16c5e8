"""Benchmarks (kernel micro-benchmarks; the lead wires `sift bench`)."""
