"""The same problem in PyTorch: torch DDP, and Pipe-SGD as a DDP communication hook, beside
this package's methods (`pipesgd compare --peers torch`).

    twins.py   the package's models (MLP, CNN, ResNet) as torch modules, and the map between
               the flat parameter vector (models/layout.py) and their tensors, both ways
    hook.py    Pipe-SGD in PyTorch: a DDP communication hook that starts this step's
               AllReduce and hands DDP the averaged gradient of the step before (staleness
               one, as methods/pipe.py; the oracle is reference.delayed_sgd)
    ranks.py   one gloo rank's training loop (torch.optim.SGD, the project's lr schedule as a
               LambdaLR, the project's shards and minibatches), and the run of a peer as
               compare reports it

Two peers, each a row of compare's table:

    torch-ddp   torch.nn.parallel.DistributedDataParallel (backend gloo, CPU, one thread a
                rank), buckets of --bucket-size as the package's ddp: synchronous SGD
    torch-pipe  the same DDP with hook.py's hook registered: Pipe-SGD of width --width

Both train the same architecture from the same initial weights on the same shards and
minibatches, with the same batch, lr schedule, optimiser and world size; their weights are
evaluated by the package's own model (the same test accuracy code as every other row).
Their traffic is gloo's, over loopback TCP: compare's emulated link (--latency, --bandwidth)
does not pace it, and the table says so.

torch is an optional extra, never a dependency: this package imports without it, and a
module here imports torch only where it is installed (`torch_problem` says why it is not, in
one line).
"""

from __future__ import annotations

PEERS = ("torch-ddp", "torch-pipe")  # compare's rows, in this order
INSTALL = "pip install 'pipesgd_ref[torch]' (in a checkout: pip install -e '.[torch]')"


def torch_problem() -> str | None:
    """None when the torch peers can run here; else why not, with how to get them."""
    try:
        import torch.distributed as dist
    except ImportError:  # the optional extra is not installed
        return f"torch is not installed; {INSTALL}"
    if not (dist.is_available() and dist.is_gloo_available()):
        return "this torch was built without torch.distributed's gloo backend"
    return None
