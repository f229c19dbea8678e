"""The lesson: Pipe-SGD whole, small and real, read in one sitting.

Read it in this order (NumPy and the standard library only: no other module of the package is
imported, so what you read is everything that runs):

    model.py     the MLP over one flat parameter vector, its gradient, the minibatches
    wire.py      arrays as length-prefixed frames over plain sockets
    ring.py      the ring AllReduce over those sockets, and the same schedule in one process
    methods.py   sync SGD, Pipe-SGD of width K (two threads), a sync parameter server, oracles
    launch.py    p worker processes (or threads) on one host, wired up, results collected
    __main__.py  a run from the command line, checked against the oracle

    python -m pipesgd_ref.core --algo pipe --world-size 4     (processes over TCP)
    python -m pipesgd_ref.core --algo pipe --threads          (ranks as threads: step through)
    pipesgd train --lesson --algo pipe                        (the product's data and outputs)
    pipesgd lesson-file pipe_sgd.py                           (all of it as one file)

The product (the rest of the package) is checked against this core: with --allreduce ring
--transport tcp its sync, pipe and ps-sync end at the weights computed here, bit for bit.
"""

from pipesgd_ref.core.launch import launch
from pipesgd_ref.core.methods import oracle
from pipesgd_ref.core.model import MLP, Problem, blobs
from pipesgd_ref.core.ring import chunk_bounds, ring_allreduce, simulate

__all__ = [
    "MLP",
    "Problem",
    "blobs",
    "chunk_bounds",
    "launch",
    "oracle",
    "ring_allreduce",
    "simulate",
]
