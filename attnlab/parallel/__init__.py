"""The ways a torchrun job splits a model or its batches: the process group (distributed.py),
tensor parallelism (tensor_parallel.py), FSDP over tensor parallelism (fsdp_tp.py) and pipeline
stages (pipeline.py). train/strategy.py chooses among them for the loop."""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
