"""Data: tokenizers, corpora, batching."""
