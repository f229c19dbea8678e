"""What every rank of a job builds from the configuration alone, built once and handed down.

The data set, the sampler that shards it, the step count, the model (its layout and size) and
the checkpoint a resumed run continues from are the same on every rank: they follow from the
config and the seed. The launcher builds them once, checks them before any worker starts (a
bad data spec or checkpoint is one line, not an error in every worker), and hands them to each
worker: forked workers inherit them, spawned ones (--device cuda) receive a pickled copy. A
joined rank (torchrun, mpirun, srun) builds its own once, before the rendezvous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import Dataset, MinibatchSampler, load_dataset
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.models import CNN, MLP, ResNet, model_for


def steps_for(cfg: TrainConfig, sampler: MinibatchSampler) -> int:
    """cfg.steps, or cfg.epochs passes over each worker's shard when epochs > 0."""
    if cfg.epochs > 0:
        return max(1, math.ceil(cfg.epochs * sampler.steps_per_epoch))
    return cfg.steps


@dataclass
class JobInputs:
    data: Dataset
    sampler: MinibatchSampler  # minibatch (worker, step) of n_workers shards
    steps: int  # the first step not run
    model: MLP | CNN | ResNet  # the host model (models.FlatModel): layout, size, w_0
    # --resume: the checkpoint's weights, the step it continues from, (pipe) the averaged
    # gradients still in flight when it was written, (momentum) the optimiser's velocity, and
    # (batch norm) the model's running statistics, worker 0's, which every rank starts from
    params: np.ndarray | None = None
    start_step: int = 0
    pending: dict = field(default_factory=dict)
    velocity: np.ndarray | None = None
    buffers: np.ndarray | None = None

    @classmethod
    def load(cls, cfg: TrainConfig, n_workers: int | None = None, resume: bool = True) -> JobInputs:
        """Load cfg's data, shard it over `n_workers` (default cfg.world_size), build the
        model, and (`resume`) read --resume's checkpoint, checked against this run's config
        and model size (every way it can be unusable is one ConfigError)."""
        data = load_dataset(cfg.dataset)
        model = model_for(cfg, data, cfg.backend)
        n = cfg.world_size if n_workers is None else n_workers
        sampler = MinibatchSampler(data.n_train, n, cfg.batch_size, cfg.seed)
        inputs = cls(data, sampler, steps_for(cfg, sampler), model)
        if cfg.resume and resume:
            from pipesgd_ref.runtime import checkpoint

            # n_params, n_buffers: a checkpoint of another model's size is refused here, in
            # one line
            restored = checkpoint.load(cfg.resume, cfg, model.n_params, model.n_buffers)
            inputs.params, inputs.start_step, inputs.pending = restored[:3]
            inputs.velocity, inputs.buffers = restored.velocity, restored.buffers
            if inputs.start_step >= inputs.steps:
                raise ConfigError(
                    f"--resume {cfg.resume}: the checkpoint is already at step "
                    f"{inputs.start_step} of {inputs.steps}; nothing to do (raise --steps to "
                    f"train further)"
                )
        return inputs

    def initial_params(self, seed: int) -> np.ndarray:
        """A fresh copy of the weights to start from: w_0 from the seed (the same on every
        rank), or the checkpoint's."""
        if self.params is not None:
            return self.params.copy()
        return self.model.init_params(seed)

    def initial_buffers(self) -> np.ndarray | None:
        """A fresh copy of the running statistics to start from (None: the model has none):
        the checkpoint's, the same on every rank, so every replica starts identical; else
        the model's init_buffers() (means 0, variances 1; also for a checkpoint written
        before checkpoints carried them, whose statistics then build up again)."""
        if not self.model.n_buffers:
            return None
        if self.buffers is not None:
            return self.buffers.copy()
        return self.model.init_buffers()
