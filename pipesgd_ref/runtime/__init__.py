"""What a worker runs in: the launcher, the worker process's runtime (data, model, weights),
checkpoints, signals and lifetime, fault injection, and the run's summary."""
