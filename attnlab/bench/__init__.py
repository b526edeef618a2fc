"""Benchmarks behind `attnlab bench`: timings as ratios against a reference in the same run."""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
