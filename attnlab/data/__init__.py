"""Data: tokenizers, corpora, batching.

Its public names (the tutorials' commands import them) are imported on first use, not here: `attnlab data
list` and `--help` start without torch or numpy.
"""

from attnlab.lazy import lazy_names

__all__ = ["scan_commands", "write_example_digits"]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "scan_commands": "attnlab.data.scan",
        "write_example_digits": "attnlab.data.images",
    },
    globals(),
)
