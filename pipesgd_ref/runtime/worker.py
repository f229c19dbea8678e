"""What every distributed training method shares, inside one worker process.

- `Worker`: the worker's runtime, built once per worker process (`Worker.for_rank`, by
  train.py's per-rank job) and handed to the method (sync, ddp, pipe, ps): its data and shard,
  model, weights and step count, and the steps every method takes the same way (the gradient
  and its finiteness check, error feedback, the AllReduce of the ring methods, the update,
  checkpoints, the device). Data, model and initial weights come from the config and the seed
  alone, so no broadcast is needed: every rank builds the same w_0.
- `WorkerResult`: what a worker hands back to the launcher when it is done.
- `compute_priority` (runtime/priority.py): --comm-first's low CPU priority of a computation.
- `diverged`: the one error of a run whose loss or weights are no longer finite.

A worker trains on its own shard: worker index `index` (0..n_workers-1) draws minibatch
(worker, step) from the sampler, exactly as the one-process oracles do. A parameter
server's rank 0 holds a Worker too (worker index 0): its weights, model and steps; it never
computes a gradient.

The model's buffers (batch norm's running statistics, models/resnet.py; None for a model
without any) live beside the weights, never in them: no codec, AllReduce or compensation
touches them. The job's statistics are worker 0's, as under PyTorch DDP (broadcast_buffers:
every replica uses rank 0's): only worker 0's forward passes update them
(`loss_and_grad`), as `reference.model_grad_fn` defines it. The other workers keep theirs as
they started: what they would compute would be overwritten by worker 0's, as DDP's broadcast
does, so they compute none. At the end of a ring method's run every replica receives rank
0's (runtime/job.py); a parameter server receives worker 0's with each of its pushes.

--device cuda (`Worker.to_device`, the ring methods): the weights, the gradient buffers and
the activations live on GPU rank mod (visible GPUs); each minibatch goes over through reusable
pinned host buffers; the update runs there; the ring stages only its chunks through the host
(comm/device_ring.py). What leaves the worker (its result, checkpoints, the progress callback's
weights) is copied back to the host. `build` itself never touches a GPU: the worker process
of a joined job builds its Worker before the rendezvous, and only `to_device`, in the method,
makes the process's CUDA context.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import Dataset, MinibatchSampler
from pipesgd_ref.errors import TrainingDiverged
from pipesgd_ref.methods.optimizer import SGD, learning_rate
from pipesgd_ref.models import CNN, MLP, ResNet, model_for
from pipesgd_ref.ops import OP_NAMES
from pipesgd_ref.runtime import faults
from pipesgd_ref.runtime.inputs import JobInputs
from pipesgd_ref.runtime.jobenv import local_rank
from pipesgd_ref.runtime.priority import compute_priority

if TYPE_CHECKING:  # a GPU worker's arrays (typed as the host arrays they stand for)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

log = logging.getLogger("pipesgd.worker")


@dataclass
class Worker:
    cfg: TrainConfig
    index: int  # this worker's index among the n_workers that compute gradients
    n_workers: int
    data: Dataset
    model: MLP | CNN | ResNet
    sampler: MinibatchSampler
    steps: int
    params: np.ndarray  # w_0: identical on every rank (same seed), or the checkpoint's (on the
    # GPU after to_device: a Numba device array)
    start_step: int = 0  # 0, or the step a resumed run continues from
    pending: dict = field(default_factory=dict)  # resumed pipe: averaged gradients in flight
    # The optimiser's state (methods/optimizer.py): momentum's velocity, beside the weights,
    # made at the first update that needs it (None: plain SGD, or none yet), or the checkpoint's
    velocity: np.ndarray | None = None
    # The model's buffers (batch norm's running statistics; None without any): its
    # init_buffers() or the checkpoint's, updated by worker 0's forward passes only
    buffers: np.ndarray | None = None
    # The optimiser's updates per step, the unit of lr_t's schedule: 1, or p for ps-async's
    # server (one update per push; its schedule runs over p * steps updates)
    updates_per_step: int = 1
    gpu: int | None = None  # --device cuda: the GPU this worker computes on (to_device sets it)
    # how stale its gradients may be, for the advice of a diverged run ("staleness 1",
    # "ps-async's staleness"; "" when the method applies fresh gradients)
    stale: str = ""

    @classmethod
    def for_rank(
        cls,
        cfg: TrainConfig,
        rank: int,
        row,
        inputs: JobInputs | None = None,
        n_workers: int | None = None,
    ) -> Worker:
        """The Worker of `rank` in a job of cfg running the method `row` (methods/table.py):
        worker index = rank in the ring methods; with a parameter server (row.server) rank 0
        is the server (index 0, the weights' keeper) and worker i is rank i + 1. `inputs`: the
        job's data, model and checkpoint, built once by the launcher; `n_workers`: the workers
        that compute (default cfg.world_size)."""
        index = rank - 1 if row.server and rank > 0 else rank
        n = cfg.world_size if n_workers is None else n_workers
        built = cls.build(cfg, index, n, inputs)
        built.stale = row.stale_note(cfg)  # for a diverged run's advice
        built.updates_per_step = n if row.checkpoint_rounds else 1  # ps-async: n pushes a step
        return built

    @classmethod
    def build(
        cls, cfg: TrainConfig, index: int, n_workers: int, inputs: JobInputs | None = None
    ) -> Worker:
        """Everything before the first step: the data, the model and w_0 (or the checkpoint
        of --resume), from `inputs` when the launcher built them once, else loaded here."""
        inputs = inputs or JobInputs.load(cfg, n_workers)
        return cls(
            cfg,
            index,
            n_workers,
            inputs.data,
            inputs.model,
            inputs.sampler,
            inputs.steps,
            inputs.initial_params(cfg.seed),
            inputs.start_step,
            dict(inputs.pending),
            None if inputs.velocity is None else inputs.velocity.copy(),
            inputs.initial_buffers(),
        )

    # --- the device (--device cuda) ----------------------------------------------------------

    @property
    def on_device(self) -> bool:
        return self.gpu is not None

    def to_device(self, rank: int) -> None:
        """--device cuda: take GPU r mod (GPUs visible, after CUDA_VISIBLE_DEVICES), r the rank
        on this host where the launcher says it (LOCAL_RANK...), else the global rank; and put
        the weights, the model's ops and buffers, and any resumed gradients on it. Nothing to
        do on the CPU. The worker's first CUDA call: its process starts without a context."""
        if self.cfg.device != "cuda":
            return
        from numba import cuda

        from pipesgd_ref.ops import cuda_ops, get_backend
        from pipesgd_ref.ops.cuda_support import simulated

        self.gpu = local_rank(rank) % len(cuda.gpus)
        cuda.select_device(self.gpu)  # this thread; pipe's comm thread enters device_scope()
        ops = get_backend("cuda")
        if simulated():  # the simulator runs one kernel at a time, in any thread
            ops = _one_kernel_at_a_time(ops)
        cfg, data = self.cfg, self.data
        self.model = model_for(cfg, data, ops)
        self.params = cuda_ops.to_device(self.params)
        self.pending = {t: cuda_ops.to_device(g) for t, g in self.pending.items()}
        if self.velocity is not None:  # a resumed run's momentum, beside the weights
            self.velocity = cuda_ops.to_device(self.velocity)
        if self.buffers is not None:  # the running statistics, where the forward runs
            self.buffers = cuda_ops.to_device(self.buffers)
        # Allocated once: the minibatch goes host -> pinned -> device every step (DMA from
        # page-locked memory, no hidden staging copy), the weights come back the same way.
        B, n = cfg.batch_size, data.n_features
        self._X_host = cuda.pinned_array((B, n), data.X_train.dtype)
        self._y_host = cuda.pinned_array((B,), data.y_train.dtype)
        self._X = cuda_ops.empty((B, n), data.X_train.dtype)
        self._y = cuda_ops.empty((B,), data.y_train.dtype)
        self._params_host = cuda.pinned_array(self.params.shape, self.params.dtype)
        self._zeros = cuda_ops.zeros(self.params.shape, self.params.dtype)
        self._device_sum = cuda.reduce(lambda a, b: a + b)  # Numba's tree reduction kernel
        log.info(
            "rank %d (worker %d): training on GPU %d of %d%s",
            rank,
            self.index,
            self.gpu,
            len(cuda.gpus),
            " (Numba's CUDA simulator)" if simulated() else "",
        )

    def device_scope(self):
        """Make this worker's GPU current in the calling thread (CUDA contexts are per thread):
        a thread other than the one that ran to_device enters it before any device work."""
        if not self.on_device:
            return contextlib.nullcontext()
        from numba import cuda

        return cuda.gpus[self.gpu]

    def new_buffer(self):
        """An uninitialised array like the weights, where they live (a gradient buffer)."""
        if self.on_device:
            from pipesgd_ref.ops import cuda_ops

            return cuda_ops.empty(self.params.shape, self.params.dtype)
        return np.empty_like(self.params)

    def zero(self, buf) -> None:
        """buf = 0 (a gradient left out by --skip-nonfinite)."""
        if self.on_device:
            buf.copy_to_device(self._zeros)  # device to device; x * 0 would keep NaN
        else:
            buf.fill(0)

    def host(self, array) -> np.ndarray:
        """A host copy of a device array; a host array itself."""
        return cast("DeviceNDArray", array).copy_to_host() if self.on_device else array

    def params_host(self) -> np.ndarray:
        """The weights on the host: the array itself on the CPU; on the GPU a copy into a
        reusable pinned buffer, overwritten by the next call (copy it to keep it)."""
        if not self.on_device:
            return self.params
        return cast("DeviceNDArray", self.params).copy_to_host(self._params_host)

    def average(self, comm, buf, codec, ok: bool = True) -> list[int]:
        """buf = the mean of every rank's buf: the host ring, or on the GPU the device ring
        (only chunks cross to the host; a codec other than none runs on a host copy).

        With --skip-nonfinite the ranks first agree on whose gradient was left out (`ok`
        False here: buf holds zeros), and the mean is over the others. Returns those ranks,
        the same list on every rank ([] when none)."""
        faults.refuse_without_frames(comm)  # PIPESGD_FAULT's wire faults need link frames
        bad = bad_ranks(comm, ok) if self.cfg.skip_nonfinite else []
        if self.on_device:
            from pipesgd_ref.comm.device_ring import device_allreduce

            device_allreduce(comm, buf, "mean", codec=codec, ops=self.model.backend)
        else:
            from pipesgd_ref.comm.collectives import allreduce

            allreduce(comm, buf, "mean", codec=codec)
        if bad:
            self.mean_of_good(buf, comm.world_size, len(bad))
        return bad

    def mean_of_good(self, avg, p: int, n_bad: int) -> None:
        """Turn the mean over p ranks (the left-out ones sent zeros) into the mean over the
        others, where the buffer lives; when every rank's was left out, zeros: the update then
        changes nothing."""
        if n_bad == p:
            self.zero(avg)
        elif n_bad and self.on_device:
            self.model.backend.scale(avg, p / (p - n_bad))
        elif n_bad:
            avg *= avg.dtype.type(p / (p - n_bad))

    # --- checkpoints, steps ------------------------------------------------------------------

    def save_checkpoint(self, next_step: int, pending: dict | None = None) -> None:
        """Write the checkpoint after step next_step - 1, never over the last good one with
        weights that are no longer finite."""
        from pipesgd_ref.runtime import checkpoint

        params = self.params_host()
        if self.on_device and pending:
            pending = {t: self.host(g) for t, g in pending.items()}
        velocity = None if self.velocity is None else self.host(self.velocity)
        buffers = None if self.buffers is None else self.host(self.buffers)
        if not np.all(np.isfinite(params)):
            raise diverged(
                f"worker {self.index}",
                f"the weights are no longer finite after step {next_step - 1}",
                self.cfg,
                " (the last good checkpoint is kept)",
                self.stale,
            )

        pending = pending or {}
        checkpoint.save(self.cfg.out, self.cfg, params, next_step, pending, velocity, buffers)

    def loss_and_grad(
        self, step: int, grads: np.ndarray, params: np.ndarray | None = None, ready=None
    ):
        """This worker's loss on its minibatch `step`, gradient written into `grads`;
        `ready(lo, hi, loss)` hears of each layer's gradient as the backward writes it
        (the model's `loss_and_grad`; ddp). Worker 0's forward also updates the running
        statistics `buffers`; the others pass none (DDP would overwrite theirs with rank 0's)."""
        X, y = self.sampler.batch(self.data, self.index, step)
        if self.on_device:  # through the pinned buffers (see to_device)
            self._X_host[...] = X
            self._y_host[...] = y
            self._X.copy_to_device(self._X_host)
            self._y.copy_to_device(self._y_host)
            X, y = self._X, self._y
        # A diverging run overflows before its loss turns inf; the check below reports that
        # as one clear error, so NumPy's overflow warnings would only be noise on the way.
        with np.errstate(over="ignore", invalid="ignore"), compute_priority(self.cfg.comm_first):
            w = self.params if params is None else params
            stats = self.buffers if self.index == 0 else None  # the job's are worker 0's
            loss = self.model.loss_and_grad(w, X, y, grads, ready, buffers=stats)
        if not math.isfinite(loss) and not self.cfg.skip_nonfinite:
            raise diverged(
                f"worker {self.index}",
                f"the training loss is {loss} at step {step}",
                self.cfg,
                stale=self.stale,
            )
        return loss

    def compute(self, step: int, grads, codec, rank: int, params=None) -> tuple[float, bool]:
        """One step's work before communication, as every ring method does it: the loss and
        gradient (into `grads`, at `params`, default this worker's weights), the fault planned
        for this (rank, step) if any (tests), the finiteness check, then error feedback.
        Returns (loss, ok); not ok (--skip-nonfinite): `grads` is zeroed, so this rank adds
        nothing to the step's sum."""
        loss = self.loss_and_grad(step, grads, params)
        faults.at_step(rank, step, grads)  # PIPESGD_FAULT; nothing otherwise
        ok = self.gradient_ok(grads, step, loss, rank)  # or an error naming rank and step
        if ok:
            self.feed_back(grads, codec)
        else:
            self.zero(grads)
        return loss, ok

    def gradient_ok(self, grads: np.ndarray, step: int, loss: float, rank: int) -> bool:
        """Whether this step's loss and gradient are finite. When they are not: an error naming
        this rank and step, or, with --skip-nonfinite, False (the caller leaves the gradient
        out of the step's average)."""
        # One pass: a NaN or Inf anywhere makes the sum non-finite. A non-finite sum of finite
        # values (an overflow) is told apart by the exact count, which only then is computed.
        with np.errstate(over="ignore", invalid="ignore"):
            if math.isfinite(loss) and math.isfinite(self._sum(grads)):
                return True
        if self.on_device:
            grads = cast("DeviceNDArray", grads).copy_to_host()  # the rare case: on the host
        bad = int(grads.size - np.count_nonzero(np.isfinite(grads)))
        if bad == 0 and math.isfinite(loss):
            return True
        if self.cfg.skip_nonfinite:
            log.warning(
                "rank %d: step %d: the gradient has %d NaN/Inf values (loss %s); "
                "left out of this step's average (--skip-nonfinite)",
                rank,
                step,
                bad,
                loss,
            )
            return False
        raise TrainingDiverged(
            f"rank {rank} (worker {self.index}): the gradient of step {step} has {bad} NaN/Inf "
            f"values of {grads.size} (loss {loss}); stopped before it reached the other ranks' "
            f"weights. Look for bad input or an unstable model on this rank, lower --lr (now "
            f"{self.cfg.lr}), or pass --skip-nonfinite to leave such gradients out and go on"
        )

    def _sum(self, grads) -> float:
        """The sum of the gradient's entries: on the device one scalar comes back, not M."""
        if self.on_device:
            return float(self._device_sum(grads))
        return float(np.add.reduce(grads))

    def codec(self):
        """The codec gradients travel with (pipesgd_ref.codecs), on this run's backend."""
        from pipesgd_ref.codecs import get_codec

        return get_codec(self.cfg.codec, self.cfg.codec_backend)

    def feed_back(self, grads: np.ndarray, codec, lo: int = 0, hi: int | None = None) -> None:
        """Error feedback (--error-feedback): add last step's residual to `grads`, then keep as
        the new residual what encoding `grads` drops. The residual is that of this worker's
        whole gradient as one code (the ring re-encodes partial sums, which no worker owns):
        the standard local form used with 1-bit SGD and PowerSGD. `lo`, `hi`: only
        grads[lo:hi], coded on its own (a ddp bucket, which leaves before the rest exists)."""
        if not self.cfg.error_feedback or codec.name == "none":
            return
        hi = grads.size if hi is None else hi
        if self.on_device:  # the codecs run on the host (as the compressed ring does)
            if not hasattr(self, "_grads_host"):
                from numba import cuda

                self._grads_host = cuda.pinned_array(grads.shape, grads.dtype)
            part = self._grads_host[lo:hi]
            device = cast("DeviceNDArray", grads)
            device[lo:hi].copy_to_host(part)
            self._feed_back_host(part, codec, lo)
            device[lo:hi].copy_to_device(part)
            return
        self._feed_back_host(grads[lo:hi], codec, lo)

    def _feed_back_host(self, part: np.ndarray, codec, lo: int) -> None:
        """part += residual[lo:...]; residual[lo:...] = part - decode(encode(part))."""
        if not hasattr(self, "_residual"):
            self._residual = np.zeros(self.params.shape, self.params.dtype)
            self._codes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if part.size not in self._codes:  # scratch per coded length, made once
            n = part.size
            self._codes[n] = (np.empty(codec.wire_bytes(n), np.uint8), np.empty(n, part.dtype))
        codes, decoded = self._codes[part.size]
        residual = self._residual[lo : lo + part.size]
        part += residual
        codec.encode(part, codes)
        codec.decode(codes, decoded)
        np.subtract(part, decoded, out=residual)

    def lr_at(self, update: int) -> float:
        """lr_t of update `update`: cfg's schedule over this run's updates (cosine's horizon:
        its steps, times p for ps-async's server, which updates once per push)."""
        return learning_rate(self.cfg, update, self.steps * self.updates_per_step)

    def sgd_step(self, grads, step: int) -> None:
        """Update `step` of the weights with `grads` (the averaged gradient, or a push at the
        server): the optimiser's rule (methods/optimizer.py), w <- w - lr_t g for plain SGD,
        on the model's backend, where the weights live. `grads` is scratch afterwards. The
        velocity lives here: in every replica of the ring methods (each applies the same
        averaged gradients in the same order, so theirs stay bitwise identical, as the
        weights do) and in the parameter server's Worker (rank 0), never in its workers'."""
        rule = SGD.of(self.cfg)
        if rule.momentum and self.velocity is None:  # v_0 = 0, where the weights live
            self.velocity = self.new_buffer()
            self.zero(self.velocity)
        rule.step(self.model.backend, self.params, grads, self.lr_at(step), self.velocity)


def diverged(
    who: str, what: str, cfg: TrainConfig, kept: str = "", stale: str = ""
) -> TrainingDiverged:
    """The error of a run whose loss or weights are no longer finite, in one form wherever it
    is found (a worker's loss or checkpoint, the one-process oracle's loss): who, what, and
    what to do. Stale gradients (`stale`: "staleness 1" for pipe of width 2, "ps-async's
    staleness") lower the largest stable step size (docs/paper.md, section 4), so the advice says
    so where they are in play. Under delay compensation (dc, dc-adaptive) with a --dc-lambda
    above the default, the correction lam g*g*(w - w_stale) grows with lam and is the first
    suspect: the advice names --dc-lambda before --lr."""
    advice = f"Lower --lr (now {cfg.lr})"
    if cfg.compensation.startswith("dc") and cfg.dc_lambda > type(cfg).dc_lambda:
        return TrainingDiverged(
            f"{who}: {what}; the run diverged{kept}. Lower --dc-lambda (now {cfg.dc_lambda:g}, "
            f"the default {type(cfg).dc_lambda}): delay compensation's correction lam g*g*(w - "
            f"w_stale) grows with it; if it still diverges, lower --lr (now {cfg.lr})"
        )
    if stale:
        advice += f"; with {stale} the largest stable step size is smaller than for synchronous SGD"
    return TrainingDiverged(f"{who}: {what}; the run diverged{kept}. {advice}")


def _one_kernel_at_a_time(backend):
    """The backend with every op behind one lock: Numba's CUDA simulator runs one kernel at a
    time per process (a second thread's launch fails), and Pipe-SGD's two threads both launch
    kernels (compute; the ring's additions). A real GPU needs no lock."""
    lock = threading.Lock()
    locked = copy.copy(backend)

    def guarded(fn):
        def op(*args, **kwargs):
            with lock:
                return fn(*args, **kwargs)

        return op

    for name in OP_NAMES:
        setattr(locked, name, guarded(getattr(backend, name)))
    return locked


def bad_ranks(comm, ok: bool) -> list[int]:
    """--skip-nonfinite in the ring methods: the ranks whose gradient of this step is left out,
    the same list on every rank (a small AllReduce of one flag per rank, in the communication
    order of the gradients themselves)."""
    from pipesgd_ref.comm.collectives import allreduce

    flags = np.zeros(comm.world_size, np.float64)
    flags[comm.rank] = 0.0 if ok else 1.0
    allreduce(comm, flags, "sum")
    return [r for r in range(comm.world_size) if flags[r]]


@dataclass
class WorkerResult:
    rank: int
    params: np.ndarray  # final weights (after the drain)
    losses: list[float]  # this worker's minibatch loss at each step
    step_end: list[float]  # perf_counter seconds at the end of each step
    events: list[dict]
    bytes_sent: int
    extra: dict = field(default_factory=dict)  # method-specific (e.g. staleness of ps-async)
    buffers: np.ndarray | None = None  # the running statistics (worker 0's: module docstring)
