"""Training: losses, schedules, checkpoints and the loop."""
