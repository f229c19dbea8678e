"""Pipe-SGD in PyTorch: a DDP communication hook that applies the previous step's gradient.

DistributedDataParallel calls a communication hook once per bucket during the backward, as
soon as the bucket's gradients are final, and writes whatever tensor the hook's Future holds
into those gradients before `optimizer.step()` reads them. DDP's default hook all-reduces the
bucket and hands back the mean: synchronous SGD. This one starts the bucket's AllReduce of
step t and hands back, at once, the mean the AllReduce of step t - s delivered (s = K - 1,
staleness one for width two): the optimiser applies avg(g_{t-s}) while avg(g_t) travels,
behind the rest of this backward and the whole of the next step, as BytePS's staleness=1
does. It is methods/pipe.py's schedule, phase by phase (t the step, W = --warmup-steps):

    phase          step t           pipe.py (compute thread)           this hook (the bucket)
    warm-up        t < W            g_t; wait avg(g_t); update          AllReduce; DDP waits
    fill           W <= t < W + s   g_t; hand over; no update           AllReduce, zeros back;
                                                                        the loop skips step()
    steady state   t >= W + s       g_t; hand over; wait avg(g_{t-s});  AllReduce(g_t), avg of
                                    w -= lr_t avg(g_{t-s})              g_{t-s} back
    drain          after the last   apply the s gradients in flight     `drain()`: the loop
                                                                        sets .grad, step()s

pipe.py's communication thread is gloo's here: `dist.all_reduce(..., async_op=True)` returns
at once, and gloo's own threads carry the bytes while the rank computes. pipe.py's K buffers
are the tensors each AllReduce owns (a copy of the bucket: DDP reuses its buffer next step).

Two things DDP decides that pipe.py does not need to think of:
- DDP may regroup its buckets after the first step (it rebuilds them in the order the
  gradients became ready), so a bucket of step t need not hold the parameters it held at step
  t - s. The stale mean is looked up per parameter (`InFlight.mean_of`), not per bucket index;
- the hook must hand back a tensor in every step, fill included: zeros there, and the training
  loop does not call optimizer.step() (a zero gradient would still move the weights under
  weight decay or momentum; pipe.py's fill makes no update at all).

The oracle is reference.delayed_sgd(staleness=s, warmup_steps=W): tests/test_torch_peer.py
holds a run of this hook against it.
"""

from __future__ import annotations

from collections import deque

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the optional extra: torch_peer.torch_problem says how to install it
    torch = dist = None


class Launch:
    """One bucket's AllReduce of one step: the tensor it sums in place (this rank's share of
    the mean, g / p), its gloo work, and where each parameter's gradient lies in it."""

    def __init__(self, params, grad, work):
        self.grad, self.work, self.done = grad, work, False
        self.where = {}  # id(parameter) -> (offset, numel) in grad
        offset = 0
        for p in params:
            self.where[id(p)] = (offset, p.numel())
            offset += p.numel()

    def mean_of(self, p):
        """p's averaged gradient (flat), waiting for the AllReduce if it is still running."""
        if not self.done:
            self.work.wait()
            self.done = True
        offset, n = self.where[id(p)]
        return self.grad[offset : offset + n]


class PipeHook:
    """The hook's state: the step, and the AllReduces of the last s steps still to apply.
    Register with `ddp.register_comm_hook(state, pipe_hook)`; call `end_step()` after each
    step, and `applies()` to know whether this step updates (not in the fill)."""

    def __init__(self, world_size: int, staleness: int = 1, warmup_steps: int = 0):
        if staleness < 1:
            raise ValueError(f"staleness must be >= 1 (0 is DDP's own hook), got {staleness}")
        self.p, self.s, self.warmup = world_size, staleness, warmup_steps
        self.step = 0
        self.launched: list[Launch] = []  # this step's buckets
        self.in_flight: deque[list[Launch]] = deque()  # steps t-s .. t-1, oldest first

    def applies(self) -> bool:
        """Whether this step's optimizer.step() applies a gradient: in the warm-up and the
        steady state, not in the fill."""
        return self.step < self.warmup or self.step >= self.warmup + self.s

    def mean_of(self, p):
        """p's averaged gradient of step t - s (the oldest step in flight)."""
        for launch in self.in_flight[0]:
            if id(p) in launch.where:
                return launch.mean_of(p)
        raise KeyError("a parameter no bucket of the step in flight holds")

    def end_step(self) -> None:
        """After the step's optimizer.step(): this step's AllReduces join those in flight, the
        one just applied leaves."""
        if self.step >= self.warmup:
            self.in_flight.append(self.launched)
            if len(self.in_flight) > self.s:
                self.in_flight.popleft()
        self.launched = []
        self.step += 1

    def drain(self, params):
        """After the last step: for each step still in flight, oldest first, [mean of each of
        `params`] (the loop writes them into .grad and calls optimizer.step())."""
        while self.in_flight:
            yield [self.mean_of(p).view_as(p) for p in params]
            self.in_flight.popleft()


def pipe_hook(state: PipeHook, bucket):  # no annotations: DDP checks them against its own
    """DDP's communication hook for Pipe-SGD (the module docstring): start avg(g_t) of this
    bucket, hand back a Future of avg(g_{t-s}) (zeros in the fill; avg(g_t) itself in the
    warm-up)."""
    grad = bucket.buffer() / state.p  # a new tensor: DDP refills its buffer next step
    work = dist.all_reduce(grad, async_op=True)  # sum of g / p over the ranks: the mean
    if state.step < state.warmup:  # warm-up: synchronous, DDP waits for this step's mean
        return work.get_future().then(lambda fut: fut.value()[0])
    state.launched.append(Launch(bucket.parameters(), grad, work))
    if len(state.in_flight) < state.s:  # fill: nothing has arrived yet
        stale = torch.zeros_like(grad)
    else:  # steady state: the mean of step t - s, in this bucket's order
        stale = torch.cat([state.mean_of(p) for p in bucket.parameters()])
    ready = torch.futures.Future()
    ready.set_result(stale)
    return ready
