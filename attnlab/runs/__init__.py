"""A run as an artefact: its directory (run_dir.py), its weights files and checksums
(weights_file.py), its model loaded for use (checkpoint.py) and the checkpoints made from its own
(derived.py: averages and exports). Whoever loads a run imports this, never training."""
