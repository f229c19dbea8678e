"""Training methods: the one-process oracles (reference.py) and, beside them, the distributed
implementations that run in worker processes and are tested against those oracles."""
