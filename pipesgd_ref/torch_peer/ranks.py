"""One torch rank's training, and a peer's run as compare reports it.

Each rank is a process that launch_local starts, as the package's workers (pinned to a core,
one BLAS thread), and runs the loop a PyTorch user writes, on the package's data:

    net = DDP(twin(model) with our w_0, bucket_cap_mb = --bucket-size)   (+ hook.py's hook)
    opt = torch.optim.SGD(lr, momentum, nesterov, weight_decay)          (methods/optimizer.py)
    lr_t: a LambdaLR over the package's schedule (optimizer.learning_rate)
    for t in steps:
        X, y = sampler.batch(data, rank, t)          the package's shard and minibatch
        loss = cross_entropy(net(X), y); opt.zero_grad(); loss.backward()
        opt.step(); sched.step()                     (torch-pipe: not in the fill)
    torch-pipe: the drain applies the gradients still in flight

The lr of update k is the package's lr_t of the step t that applies it (the oracle's
indexing: reference.delayed_sgd applies avg(g_{t-s}) at lr_t): t = k in the warm-up, k + s
after it (the fill makes no update, so the updates run s steps behind), which the drain
continues at t = T, T + 1, ...

Timing as summary.py times the package's runs: the iteration is the median step of rank 0 in
steady state (after warmup_steps + width + 1 steps); rank 0 keeps a copy of the weights every
eval_every steps, evaluated after training by the package's own model (twins.flat_of), which
gives the time to the target accuracy from the start of step 0.
"""

from __future__ import annotations

import datetime
import inspect
import statistics
import time

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.optimizer import learning_rate
from pipesgd_ref.runtime.inputs import JobInputs
from pipesgd_ref.runtime.summary import reaching_target
from pipesgd_ref.torch_peer.hook import PipeHook, pipe_hook
from pipesgd_ref.torch_peer.twins import flat_of, load_flat, twin
from pipesgd_ref.units import parse_size

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:  # the optional extra: torch_peer.torch_problem says how to install it
    torch = dist = DDP = None

PIPE = "torch-pipe"  # the peer that registers hook.py's hook (torch-ddp: DDP's own)
MIB = 1 << 20  # DDP's bucket_cap_mb counts MiB


def update_step(k: int, warmup: int, staleness: int) -> int:
    """The step whose lr update k applies at: k in the warm-up, k + s after it."""
    return k if k < warmup else k + staleness


def own_buffers() -> dict:
    """DDP's option that leaves each rank its own running statistics, as the package's ResNet
    does (the collective averages gradients only; they start equal on every rank): by default
    DDP copies rank 0's into every rank before each forward. Its name changed in torch 2.13."""
    if "forward_sync_buffers" in inspect.signature(DDP).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def torch_rank(comm, cfg: TrainConfig, peer: str, port: int, inputs: JobInputs | None) -> dict:
    """launch_local's target: one rank of a gloo job (its own connections; `comm`, the
    package's, gives the rank and world size only). Returns rank_run's figures."""
    torch.set_num_threads(1)  # one core a rank, as the package's workers
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=comm.rank,
        world_size=comm.world_size,
        timeout=datetime.timedelta(seconds=cfg.timeout),
    )
    try:
        return rank_run(comm.rank, comm.world_size, cfg, peer, inputs or JobInputs.load(cfg))
    finally:
        dist.destroy_process_group()


def rank_run(rank: int, world: int, cfg: TrainConfig, peer: str, inputs: JobInputs) -> dict:
    """Train; {"losses", "step_end", "start", "params", "buffers"} and, on rank 0, the
    snapshots' "eval_curve" and the final "test_accuracy"."""
    model, steps = inputs.model, inputs.steps
    net = twin(model)
    load_flat(net, model, inputs.initial_params(cfg.seed))
    ddp = DDP(net, bucket_cap_mb=parse_size(cfg.bucket_size) / MIB, **own_buffers())
    hook, s = None, 0
    if peer == PIPE:
        s = cfg.staleness
        hook = PipeHook(world, staleness=s, warmup_steps=cfg.warmup_steps)
        ddp.register_comm_hook(hook, pipe_hook)
    opt = torch.optim.SGD(
        ddp.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
    )
    lr_t = lambda k: learning_rate(cfg, update_step(k, cfg.warmup_steps, s), steps)  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_t(k) / cfg.lr)
    losses, ends, snapshots = [], [], []
    dist.barrier()
    start = time.perf_counter()
    for t in range(steps):
        X, y = inputs.sampler.batch(inputs.data, rank, t)
        loss = torch.nn.functional.cross_entropy(ddp(torch.from_numpy(X)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()  # DDP all-reduces each bucket here (torch-pipe: the hook)
        if hook is None or hook.applies():
            opt.step()
            sched.step()
        if hook is not None:
            hook.end_step()
        ends.append(time.perf_counter())
        losses.append(loss.item())
        if rank == 0 and cfg.eval_every and (t + 1) % cfg.eval_every == 0:
            snapshots.append((t + 1, ends[-1], [v.clone() for v in net.state_dict().values()]))
    if hook is not None:  # the drain: what is still in flight, oldest first
        params = list(net.parameters())
        for means in hook.drain(params):
            for p, g in zip(params, means, strict=True):
                p.grad.copy_(g)
            opt.step()
            sched.step()
    out = {"losses": losses, "step_end": ends, "start": start}
    out["params"], out["buffers"] = flat_of(net, model)
    if rank == 0:
        out.update(evaluate(net, model, inputs.data, snapshots, start, out))
    return out


def evaluate(net, model, data, snapshots: list, start: float, final: dict) -> dict:
    """The test accuracy of every snapshot (after training, as the Recorder's) and of the
    final weights, by the package's model."""
    keys = list(net.state_dict())
    curve = []
    for step, when, values in snapshots:
        net.load_state_dict(dict(zip(keys, values, strict=True)))
        params, buffers = flat_of(net, model)
        acc = model.accuracy(params, data.X_test, data.y_test, buffers)
        curve.append({"step": step, "wall_time_s": when - start, "test_accuracy": acc})
    acc = model.accuracy(final["params"], data.X_test, data.y_test, final["buffers"])
    return {"eval_curve": curve, "test_accuracy": acc}


def summarise_peer(cfg: TrainConfig, peer: str, per_rank: list[dict], wall: float) -> dict:
    """The summary of a peer's run, with the keys compare's table reads from the package's
    (runtime/summary.py): the iteration (rank 0's median steady-state step), the loss curve
    (the mean over ranks), the time to target, the test accuracy."""
    first = per_rank[0]
    ends = np.array(first["step_end"])
    width = cfg.width if peer == PIPE else 1
    skip = min(len(ends) - 1, cfg.warmup_steps + width + 1)  # steady state, as summary.py
    iters = np.diff(ends[skip:]) if len(ends) - skip > 1 else np.diff(ends)
    losses = np.mean([r["losses"] for r in per_rank], axis=0)
    curve = [
        {"step": t, "wall_time_s": float(ends[t] - first["start"]), "loss": float(losses[t])}
        for t in range(len(losses))
    ]
    return {
        "algo": peer,
        "world_size": cfg.world_size,
        "width": width,
        "steps": len(losses),
        "wall_time_s": wall,
        "iter_time_s": float(statistics.median(iters)) if len(iters) else None,
        "t_comp_s": None,  # DDP's backward holds its communication: no compute span alone
        "t_comm_s": None,
        "comm_hidden_fraction": None,
        "final_train_loss": float(np.mean(losses[-max(1, len(losses) // 20) :])),
        "test_accuracy": first["test_accuracy"],
        **reaching_target(first["eval_curve"], cfg.target_accuracy),
        "params_identical_on_all_ranks": all(
            np.array_equal(r["params"], first["params"]) for r in per_rank
        ),
        "link": "gloo over loopback TCP, not emulated",
        "torch": torch.__version__,
        "bucket_cap_bytes": parse_size(cfg.bucket_size),
        "config": cfg.to_dict(),
        "loss_curve": curve,
        "eval_curve": first["eval_curve"],
    }


def run_peer(cfg: TrainConfig, peer: str, inputs: JobInputs | None = None) -> tuple[dict, list]:
    """A peer's whole run on cfg.world_size local ranks: (its summary, each rank's figures,
    params included, in rank order)."""
    from pipesgd_ref.runtime.launch import free_port, launch_local

    inputs = inputs or JobInputs.load(cfg)  # once, before the fork: the ranks inherit it
    started = time.perf_counter()
    per_rank = launch_local(
        cfg.world_size,
        torch_rank,
        (cfg, peer, free_port(), inputs),
        start_method="fork",
        timeout=cfg.timeout,
    )
    return summarise_peer(cfg, peer, per_rank, time.perf_counter() - started), per_rank
