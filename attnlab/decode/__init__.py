"""Decoding over the incremental-decoding cache: greedy, beam search and sampling (search.py),
speculative decoding with a draft model (speculative.py), translating lines of text (translate.py)."""
