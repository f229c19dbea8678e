"""The ranks of a joined job agree on their options, checked right after they meet.

Every rank of a job that torchrun, mpirun or srun started parses its own command line; a rank
given another --lr would train on (its weights quietly different from the others'), and one
given other --steps would fail hundreds of steps later inside an AllReduce that never names
--steps. So, once the ranks have joined and before the first step, each rank's options that
must agree (all of TrainConfig but PER_RANK) are compared: one AllReduce of a 48-bit digest
per rank, and only when the digests differ, the options themselves (`collectives.allgather`,
float64 arrays: no pickle), so that every rank can name the option and each rank's value. Every
rank sees the same gathered figures, so every rank decides alike and refuses in the same line.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from pipesgd_ref.comm.agree import differences, flags
from pipesgd_ref.comm.collectives import allgather
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError

# Options a rank may set for itself: where rank 0 writes and each rank resumes from (paths on
# its own host), the host's ops and codec kernels (bitwise alike: ops/, codecs/), how long this
# rank waits, and its CPU priority. Everything else defines the run every rank takes part in.
PER_RANK = ("out", "resume", "backend", "codec_backend", "timeout", "comm_first", "master_port")

__all__ = ["PER_RANK", "check_same_options", "differences"]


def shared_options(cfg: TrainConfig) -> dict:
    """cfg's options that every rank of a job must give alike."""
    return {k: v for k, v in cfg.to_dict().items() if k not in PER_RANK}


def check_same_options(comm, cfg: TrainConfig) -> None:
    """Refuse, on every rank at once, a job whose ranks were started with different options
    (ConfigError naming the option and each rank's value). A collective: every rank calls it,
    right after the job forms."""
    text = json.dumps(shared_options(cfg), sort_keys=True)
    digest = float(int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big"))
    digests = allgather(comm, np.array([digest]))
    if all(np.array_equal(d, digests[0]) for d in digests):
        return
    mine = np.frombuffer(text.encode(), np.uint8).astype(np.float64)
    everyone = [json.loads(bytes(a.astype(np.uint8)).decode()) for a in allgather(comm, mine)]
    raise ConfigError(
        f"the ranks of this job were started with different options: {differences(everyone)}; "
        f"start every rank with the same options (only --{', --'.join(flags(PER_RANK))} may "
        f"differ)"
    )
