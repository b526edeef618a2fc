"""Decoding: greedy search over the incremental-decoding cache (beam search and sampling to come)."""
