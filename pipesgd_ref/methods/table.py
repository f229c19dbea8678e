"""The methods, one row each: the only place a method's name is tied to what it is.

    name       the loop (one file)     ranks    staleness of the applied gradient
    sync       sync.sync_worker        p        0
    ddp        ddp.ddp_worker          p        0       (AllReduce in buckets during backward)
    pipe       pipe.pipe_worker        p        K - 1   (K = --width: 1 at the default K = 2)
    ps-sync    ps.ps_sync_worker       p + 1    0       (rank 0 serves, ranks 1..p compute)
    ps-async   ps.ps_async_worker      p + 1    unbounded ((p - 1)(2S + 1) with --max-staleness S)

Everything else that differs between methods is a field of the row (which options a method
takes, its weight copies, whether it keeps a server): commands, checks and reports ask the row,
never compare the name. Adding a method is one file with its loop and one row here.

The table is data: a row names its loop ("module:function") and imports it when a job asks
for it (`row.loop`), so that checking a configuration (`pipesgd config`, the preflight) does
not load NumPy models, Numba and the sockets of every method first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError


@dataclass(frozen=True)
class Method:
    name: str
    where: str  # "module:function" of its loop(comm, cfg, hooks=None) -> WorkerResult
    server: bool  # rank 0 is a parameter server: the job runs world_size + 1 processes
    # "0", "K - 1" or "unbounded": how many updates old the applied gradient may be
    staleness: str
    pipelined: bool = False  # takes --width K > 2 and --warmup-steps (a pipeline to fill)
    compensations: tuple[str, ...] = ()  # the --compensation kinds that pay its staleness back
    bounded_staleness: bool = False  # takes --max-staleness S (stale synchronous parallel)
    # Takes --device cuda: the ring methods' weights, buffers and ring live on the GPU.
    on_device: bool = False
    checkpoint_rounds: bool = False  # a checkpoint step is a round of p pushes (ps-async)
    bucketed: bool = False  # takes --bucket-size: the gradient leaves in buckets (ddp)
    # Takes --skip-nonfinite: a rank's whole gradient can still be left out of a step's mean
    # when it is not finite (not so when its buckets leave before the whole exists: ddp).
    skips_nonfinite: bool = True

    @property
    def loop(self) -> Callable:
        """The method's loop, one rank of it: loop(comm, cfg, hooks=None) -> WorkerResult."""
        module, _, name = self.where.partition(":")
        return getattr(importlib.import_module(module), name)

    def ranks(self, world_size: int) -> int:
        """Processes a job of p workers runs: p, or p + 1 with a server."""
        return world_size + 1 if self.server else world_size

    def stale(self, cfg: TrainConfig) -> bool:
        """Whether an applied gradient can be older than the weights it meets."""
        return self.staleness == "unbounded" or (self.pipelined and cfg.width > 1)

    def stale_note(self, cfg: TrainConfig) -> str:
        """How stale the applied gradients are, in words for advice ("staleness 1"), or ""."""
        if not self.stale(cfg):
            return ""
        return f"staleness {cfg.staleness}" if self.pipelined else f"{self.name}'s staleness"

    def weight_copies(self, cfg: TrainConfig) -> int:
        """Vectors of n_params float32 each rank keeps at least: the server's weights, the
        sum and a receive buffer; a ring method's weights, one gradient buffer per step in
        flight (K for the pipe, 1 for sync) and one for the AllReduce's codes; plus the
        error-feedback residual."""
        if self.server:
            copies = 3
        else:
            copies = 1 + (cfg.width if self.pipelined else 1) + 1
        return copies + (1 if cfg.error_feedback else 0)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "sync",
            "pipesgd_ref.methods.sync:sync_worker",
            server=False,
            staleness="0",
            on_device=True,
        ),
        Method(
            "ddp",
            "pipesgd_ref.methods.ddp:ddp_worker",
            server=False,
            staleness="0",
            on_device=True,
            bucketed=True,
            skips_nonfinite=False,
        ),
        Method(
            "pipe",
            "pipesgd_ref.methods.pipe:pipe_worker",
            server=False,
            staleness="K - 1",
            pipelined=True,
            compensations=("dc", "dc-adaptive", "predict"),
            on_device=True,
        ),
        Method("ps-sync", "pipesgd_ref.methods.ps:ps_sync_worker", server=True, staleness="0"),
        Method(
            "ps-async",
            "pipesgd_ref.methods.ps:ps_async_worker",
            server=True,
            staleness="unbounded",
            compensations=("dc", "dc-adaptive"),
            bounded_staleness=True,
            checkpoint_rounds=True,
        ),
    )
}


def method(name: str) -> Method:
    """The row of `name`; a name no row has is refused with the list of those that exist."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"algo must be one of {', '.join(METHODS)}, got {name!r}") from None
