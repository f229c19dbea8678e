"""The presets of TrainConfig (config.py): named starting points, each a dict of fields; every
field not named keeps its default."""

from __future__ import annotations

from typing import Any

_COMPARE_CNN = dict(
    dataset="mnist5k",
    model="cnn",
    channels=(6, 16),
    kernels=(5, 5),
    hidden=(120, 84),
    world_size=4,
    batch_size=32,
    lr=0.05,
    steps=200,
    eval_every=10,
    target_accuracy=0.9,
    latency="50us",
    ps_pulls="shared",
)
PRESETS: dict[str, dict[str, Any]] = {
    # digits, 4 workers, a small MLP: seconds on a laptop
    "laptop": dict(
        dataset="digits",
        model="mlp",
        hidden=(64,),
        world_size=4,
        batch_size=32,
        lr=0.1,
        steps=600,
        eval_every=100,
    ),
    # `pipesgd compare`: digits on an MLP 64-1024-1024-10 (1.13M parameters, a 4.5 MB
    # gradient), 4 workers x batch 352 (nearly each worker's whole shard), an emulated link of
    # 50 us whose bandwidth compare chooses for the machine at hand (commands/compare_link.py):
    # where a ring AllReduce of the gradient takes as long as a step's computation, the
    # paper's communication-heavy regime (about 700 Mbit/s on a two-core laptop). ps-sync is
    # the conventional server (its pulls share its link). A copy of the weights every 2 steps,
    # evaluated after the run, gives the time to the target.
    "compare": dict(
        dataset="digits",
        model="mlp",
        hidden=(1024, 1024),
        world_size=4,
        batch_size=352,
        lr=0.03,
        steps=40,
        eval_every=2,
        target_accuracy=0.96,
        latency="50us",
        ps_pulls="shared",
    ),
    # a LeNet-5 on 5,000 real MNIST images (the `images` extra), on a link compare chooses so
    # that the ring AllReduce of its 431 KB gradient takes as long as a step's computation:
    # the CNN, too, in the communication-heavy regime
    "compare-cnn": _COMPARE_CNN,
    # the same on a 10 Gbit/s link, named here so that compare keeps it: compute-bound, where
    # pipelining has little to hide
    "compare-cnn-compute": {**_COMPARE_CNN, "bandwidth": "10Gbit"},
    # `pipesgd compare --model resnet`: a deep net with batch norm, in the same communication-heavy
    # regime (compare chooses the link's bandwidth: about 300 Mbit/s on a quiet two-core machine
    # here, 100-130 on a busy one). Built-in digits (8 x 8): MNIST's 28 x 28 images cost about 12x
    # the compute per image, minutes per method on two cores. Depth 8, the family's smallest (stem,
    # one basic block per stage, two of them with a projection, dense head) at He et al.'s CIFAR
    # widths 16, 32, 64: 77,754 parameters, a 311 KB gradient (the CNN's: 431 KB), ten backward
    # units for ddp's buckets. Batch 32 a worker: 10-15 ms a step alone on a core. Plain SGD at lr
    # 0.1: sync, ddp and ps-sync reached 95% at step 48 here, pipe at 52 (six runs); momentum 0.9 at
    # lr 0.01 (the same effective step, lr / (1 - M)) reached it later (pipe: step 64) and costs two
    # more passes an update. 100 steps (--quick: 80), twice what the target takes (97-98% at the
    # end); the weights every 4 steps, each evaluation on the 360 test images about 0.1 s after the
    # run. 70 s on a quiet machine here, 2 minutes on a busy one (--quick: 40 s to a minute), most
    # of it ps-sync's, whose server's link carries 8 gradients a step.
    "compare-resnet": dict(
        dataset="digits",
        model="resnet",
        depth=8,
        channels=(16, 32, 64),
        world_size=4,
        batch_size=32,
        lr=0.1,
        steps=100,
        eval_every=4,
        target_accuracy=0.95,
        latency="50us",
        ps_pulls="shared",
    ),
    # the smallest run that still learns: for CI, tutorials and smoke tests
    "tiny": dict(
        dataset="digits",
        model="softmax",
        hidden=(),
        world_size=2,
        batch_size=16,
        lr=0.1,
        steps=60,
        eval_every=20,
        target_accuracy=0.8,
    ),
}

# `pipesgd compare --model M` starts from M's own comparison (commands/parser.py), not from the
# MLP's problem with M swapped in
COMPARE_PRESET_OF_MODEL = {"cnn": "compare-cnn", "resnet": "compare-resnet"}

__all__ = ["COMPARE_PRESET_OF_MODEL", "PRESETS"]
