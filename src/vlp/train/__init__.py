"""Training machinery: loop, optimiser/schedule, checkpoints and the distributed helpers."""
