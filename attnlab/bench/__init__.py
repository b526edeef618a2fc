"""Benchmarks behind `attnlab bench`: timings as ratios against a reference in the same run."""
