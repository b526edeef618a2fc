"""Decoding over the incremental-decoding cache: greedy, beam search and sampling (search.py),
speculative decoding with a draft model (speculative.py), translating lines of text (translate.py)."""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
