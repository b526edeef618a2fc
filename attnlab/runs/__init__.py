"""A run as an artefact: its directory (run_dir.py), one checkpoint's files (checkpoint_files.py), its
config file (config.py) and its train section (train_config.py), its weights files and checksums
(weights_file.py), its model loaded for use (checkpoint.py), its data read with its own tokenizers
(data.py), a model started from its trained weights (init.py), the run opened for training, new or
resumed (opening.py) and the checkpoints made from its own (derived.py: averages and exports). Whoever
reads or loads a run imports this, never training."""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
