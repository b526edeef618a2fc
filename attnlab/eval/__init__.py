"""Evaluation metrics."""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
