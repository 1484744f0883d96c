"""Training machinery: the loop, optimiser and schedule, checkpoints (the process group is :mod:`vlp.distributed`,
the loaders :mod:`vlp.data.loader`)."""
