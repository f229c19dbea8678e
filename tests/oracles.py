"""What the tests that hold a distributed run against its one-process oracle share: the
oracle's inputs for a config, the oracle's run (sync or delayed SGD), how close a run must come
to it, and the mean taken in the ring's order of additions."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.schedule import simulate_allreduce, simulate_compressed_allreduce
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn, sync_sgd
from pipesgd_ref.runtime.worker import Worker


def oracle_inputs(cfg, n_workers: int):
    """(grad_fn, w_0) of the one-process oracles for `n_workers` workers of `cfg`: each
    worker's minibatches and the w_0 every rank starts from."""
    setup = Worker.build(cfg, 0, n_workers)
    return model_grad_fn(setup.model, setup.data, setup.sampler), setup.params


def oracle(cfg, staleness: int, warmup: int = 0):
    """The one-process run of `cfg` on cfg.world_size workers: sync SGD (staleness 0, no
    warm-up), else SGD applying the gradient `staleness` steps late after `warmup` sync steps;
    with cfg's optimiser and schedule (its lr_t over the run's steps) and compensation."""
    worker = Worker.build(cfg, 0, cfg.world_size)
    grad_fn = model_grad_fn(worker.model, worker.data, worker.sampler)
    w0, p, steps = worker.model.init_params(cfg.seed), cfg.world_size, worker.steps
    lr, rule = worker.lr_at, SGD.of(cfg)
    if staleness == 0 and warmup == 0:
        return sync_sgd(grad_fn, w0, p, steps, lr, optimizer=rule)
    return delayed_sgd(grad_fn, w0, p, steps, lr, staleness=staleness, warmup_steps=warmup,
                       compensation=cfg.compensation, dc_lambda=cfg.dc_lambda,
                       optimizer=rule)  # fmt: skip


def assert_matches_oracle(results, want, p):
    """Every rank ends with the same weights, within 1e-6 (relative) of the oracle's, bitwise
    for p <= 2; the ranks' mean losses within 1e-5 of the oracle's."""
    for r in results:  # the replicas never drift apart
        np.testing.assert_array_equal(r.params, results[0].params, err_msg=f"rank {r.rank}")
    got = results[0].params
    scale = np.max(np.abs(want.params))
    worst = np.max(np.abs(got - want.params)) / scale
    if p <= 2:  # two terms add in the same order in the ring and in the oracle: bitwise
        assert worst == 0, f"p={p}: expected bitwise equality, relative difference {worst:.2e}"
    assert worst <= 1e-6, f"p={p}: relative difference {worst:.2e} from the oracle (max 1e-6)"
    losses = np.mean([r.losses for r in results], axis=0)
    np.testing.assert_allclose(losses, want.losses, rtol=1e-5)


def ring_ordered_average(grad_fn, params, world_size: int, step: int):
    """reference.average_gradient with the mean summed in the ring's order of additions
    (schedule.simulate_allreduce), which a ring run equals bitwise at any p."""
    losses, grads = zip(*(grad_fn(params, r, step) for r in range(world_size)), strict=True)
    return sum(losses) / world_size, simulate_allreduce(list(grads), "mean")[0]


def use_ring_order(monkeypatch) -> None:
    """Make the oracles of `reference` average in the ring's order for this test."""
    monkeypatch.setattr(reference, "average_gradient", ring_ordered_average)


def bucket_ring_average(plan, codec=None):
    """An `average` for reference.sync_sgd: each bucket (lo, hi) of `plan` averaged on its own
    in the ring's order of additions for that bucket (the compressed ring's with `codec`),
    which a ddp run equals bitwise at any p."""

    def average(grad_fn, params, world_size: int, step: int):
        losses, grads = zip(*(grad_fn(params, r, step) for r in range(world_size)), strict=True)
        mean = np.empty_like(params)
        for lo, hi in plan:
            parts = [g[lo:hi] for g in grads]
            if codec is None:
                mean[lo:hi] = simulate_allreduce(parts, "mean")[0]
            else:
                mean[lo:hi] = simulate_compressed_allreduce(parts, codec, "mean")[0]
        return sum(losses) / world_size, mean

    return average


def ddp_oracle(cfg, codec=None):
    """The one-process run of ddp for cfg: sync_sgd with the mean taken bucket by bucket in
    the ring's order (bitwise what the distributed run computes)."""
    from pipesgd_ref.models.layout import buckets
    from pipesgd_ref.units import parse_size

    worker = Worker.build(cfg, 0, cfg.world_size)
    grad_fn = model_grad_fn(worker.model, worker.data, worker.sampler)
    plan = buckets(worker.model.grad_units(), parse_size(cfg.bucket_size))
    w0, p, steps = worker.model.init_params(cfg.seed), cfg.world_size, worker.steps
    return sync_sgd(grad_fn, w0, p, steps, worker.lr_at, average=bucket_ring_average(plan, codec),
                    optimizer=SGD.of(cfg))  # fmt: skip
