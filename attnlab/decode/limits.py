"""Decoding limits: beyond these a request is a mistake, not a workload (docs/reliability.md). Free of
torch, so that the command line can name them without importing it."""

MAX_BATCH, MAX_BEAM, MAX_NEW_TOKENS = 1024, 64, 100_000
