"""What the tests that hold a distributed run against its one-process oracle share: the
oracle's inputs for a config, and the mean taken in the ring's order of additions."""

from __future__ import annotations

from pipesgd_ref.comm.schedule import simulate_allreduce
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.reference import model_grad_fn
from pipesgd_ref.runtime.worker import Worker


def oracle_inputs(cfg, n_workers: int):
    """(grad_fn, w_0) of the one-process oracles for `n_workers` workers of `cfg`: each
    worker's minibatches and the w_0 every rank starts from."""
    setup = Worker.build(cfg, 0, n_workers)
    return model_grad_fn(setup.model, setup.data, setup.sampler), setup.params


def ring_ordered_average(grad_fn, params, world_size: int, step: int):
    """reference.average_gradient with the mean summed in the ring's order of additions
    (schedule.simulate_allreduce), which a ring run equals bitwise at any p."""
    losses, grads = zip(*(grad_fn(params, r, step) for r in range(world_size)), strict=True)
    return sum(losses) / world_size, simulate_allreduce(list(grads), "mean")[0]


def use_ring_order(monkeypatch) -> None:
    """Make the oracles of `reference` average in the ring's order for this test."""
    monkeypatch.setattr(reference, "average_gradient", ring_ordered_average)
