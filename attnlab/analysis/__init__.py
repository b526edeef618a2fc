"""Looking inside models: parameter, memory and compute budgets; attention analysis.

Its public names (the translation tutorial's Python example and docs/analysis.md import them) are imported on first use,
not here: plots.py brings in matplotlib, which the commands that only read a budget never need.
"""

from attnlab.lazy import lazy_names

__all__ = ["capture_attention", "positional_plots"]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "capture_attention": "attnlab.analysis.capture",
        "positional_plots": "attnlab.analysis.plots",
    },
    globals(),
)
