"""Which AllReduce algorithm a message takes: the one the job asked for, or under `auto` the one
whose calibrated model says it is fastest for this many bytes on this job.

Every algorithm has an alpha-beta model of the same shape,

    T(algo, p, M) = steps(algo, p, M) * alpha_algo + volume(algo, p) * M * beta_algo

where `steps` counts the latencies on the critical path (hops for the link algorithms,
synchronisations for the shared-memory group) and `volume` the bytes each rank moves or adds
per byte of message (comm/algorithms.py derives both for the link algorithms; the ring's are
2(p-1) and 2(p-1)/p; `sent_volume` is the part of the volume a rank hands to the others, what
its counters count). alpha_algo and beta_algo are fitted to measured times on this machine
(`pipesgd bench allreduce --fit`, which writes them beside the package's defaults); no size
threshold is written anywhere: the crossover sizes are where the fitted lines cross.

`auto` takes the fastest model among the algorithms this job can run: the ring always; rd and
rab when the job made their links (comm.mesh); oneshot and twoshot when it formed one host's
shared-memory group (comm.group). The choice is the job's, not a rank's: it depends only on
(p, M, the job's transport, the figures), and both are fixed at rendezvous, the same on every
rank. The figures are read once, by rank 0, and handed to every rank with the address table
(comm/rendezvous.py), so a host's own fit, or a fit written while the job runs, changes nothing
in it; the transport is the slowest among all the job's links, derived from that table (two
hosts of two ranks: tcp, though half the ring's links are shared memory).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

from pipesgd_ref.comm import algorithms, shm_group
from pipesgd_ref.errors import ConfigError

NAMES = ("ring", "rd", "rab", "oneshot", "twoshot")
DEFAULT_MODELS = Path(__file__).with_name("allreduce_models.json")
MODELS_ENV = "PIPESGD_ALLREDUCE_MODELS"  # names the user's file (user_models_path)


def user_models_path() -> Path:
    """Where `pipesgd bench allreduce --fit` writes this machine's figures (they win over the
    package's): $PIPESGD_ALLREDUCE_MODELS, else ~/.cache/pipesgd/allreduce_models.json."""
    env = os.environ.get(MODELS_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "pipesgd" / "allreduce_models.json"


def steps(algo: str, p: int, nbytes: int) -> float:
    """Latencies on the critical path of one AllReduce of nbytes."""
    if p <= 1:
        return 0.0
    if algo == "ring":
        return 2.0 * (p - 1)
    if algo in ("oneshot", "twoshot"):
        pieces = max(1, math.ceil(nbytes / shm_group.SLOT_BYTES))  # one sync set per piece
        return pieces * (1.0 if algo == "oneshot" else 2.0)
    return algorithms.cost(algo, p, nbytes, 1.0, math.inf)  # its latency term alone


def volume(algo: str, p: int) -> float:
    """Bytes moved (or added) per rank on the critical path, per byte of message."""
    if p <= 1:
        return 0.0
    if algo == "ring":
        return 2.0 * (p - 1) / p
    if algo == "oneshot":
        return 1.0 + p  # copy in, then read every rank's slot
    if algo == "twoshot":
        return 3.0  # copy in, sum one p-th from p slots, copy every sum out
    return algorithms.cost(algo, p, 1.0, 0.0, 1.0)  # its bandwidth term for one byte


def sent_volume(algo: str, p: int) -> float:
    """Payload bytes a rank hands to the others per byte of message: what its counters count
    (Communicator.bytes_sent, less the frames' headers; the AllReduce tally, `allreduce_ran`).

    Over links it is `volume` itself: the ring's 2(p-1)/p, and rd's log2 p and rab's
    2(p-1)/p when p is a power of two. (Otherwise rd's and rab's volume is the critical path's,
    the fold and the copy back included, which no single rank sends all of: each sends its own
    schedule's ranges, comm/algorithms.py.) In the shared-memory group `volume` also counts what
    a rank reads and adds; what it hands over is what it writes for the others to read: oneshot
    its piece (1, the "copy in"), twoshot its piece and its share of the sums (1 + 1/p)."""
    if p <= 1:
        return 0.0
    if algo == "oneshot":
        return 1.0
    if algo == "twoshot":
        return 1.0 + 1.0 / p
    return volume(algo, p)


def model_time(algo: str, p: int, nbytes: int, alpha: float, beta: float) -> float:
    return steps(algo, p, nbytes) * alpha + volume(algo, p) * nbytes * beta


MAX_MODELS_BYTES = 1 << 20  # a models file is a few KB; anything past 1 MiB is not one


def read_models(path) -> dict[str, dict[str, tuple[float, float]]]:
    """{transport: {algorithm: (alpha, beta)}} from an AllReduce models file (the package's,
    or one `pipesgd bench allreduce --fit` wrote). Every way a file can be wrong (missing
    when named, unreadable, not a regular file, too large, not JSON, wrong types, negative
    or non-finite figures) is a ConfigError of one line naming the file and what is wrong,
    with the fix. Algorithms this version does not know are skipped (a newer version's file)."""
    path = Path(path)
    where = f"AllReduce models file {path}"
    fix = ("fix or delete it (`pipesgd bench allreduce --fit` writes a new one; "
           "$PIPESGD_ALLREDUCE_MODELS names another)")  # fmt: skip
    real = os.path.realpath(path)
    if real.startswith(("/proc/", "/sys/", "/dev/")):  # made up as read, and some block
        raise ConfigError(f"{where} is {real}, a file the kernel makes, not a models file; {fix}")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: a fifo would block it
            raise ConfigError(f"{where} is not a regular file; {fix}")
        with open(path, "rb") as f:
            text = f.read(MAX_MODELS_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read ({e.strerror or e}); {fix}") from None
    if len(text) > MAX_MODELS_BYTES:
        raise ConfigError(f"{where} is over {MAX_MODELS_BYTES >> 20} MiB: not a models file; {fix}")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        why = "is empty" if not text.strip() else f"is not JSON ({e})"
        raise ConfigError(f"{where} {why}; {fix}") from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ConfigError(f'{where} has no "models" object (an object of transports); {fix}')
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for transport, algos in models.items():
        if not isinstance(algos, dict):
            raise ConfigError(f"{where}: models.{transport} is not an object of algorithms; {fix}")
        for name, m in algos.items():
            if name not in NAMES:
                continue
            pair = ("alpha", "beta")
            figures: list[Any] = [m.get(k) if isinstance(m, dict) else None for k in pair]
            ok = all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in figures
            )  # fmt: skip
            if not ok:
                raise ConfigError(
                    f'{where}: models.{transport}.{name} needs "alpha" and "beta", two '
                    f"finite numbers >= 0 (seconds, seconds per byte), got {m!r:.80}; {fix}"
                )
            out.setdefault(transport, {})[name] = (float(figures[0]), float(figures[1]))
    return out


def job_models() -> dict[str, dict[str, tuple[float, float]]]:
    """The figures `auto` chooses by, for every transport: the package's, overlaid by the
    user's file when there is one (user_models_path). Read once per job, on rank 0, at
    rendezvous (comm/rendezvous.py hands them to every rank), so every rank chooses alike and
    a file rewritten while a job runs does not change it."""
    out = read_models(DEFAULT_MODELS)
    user = user_models_path()
    if user.exists() or user.is_symlink():  # none yet: the package's figures alone
        for transport, algos in read_models(user).items():
            out.setdefault(transport, {}).update(algos)
    return out


def launcher_models() -> None:
    """`job_models()` read by a launcher before any rank starts (train, compare, bench), so a
    broken file is one ConfigError line, not one per rank. A file $PIPESGD_ALLREDUCE_MODELS
    names that does not exist yet is said once on stderr: a typo in the path would otherwise
    pass unseen, the package's figures silently in its place (`bench allreduce --fit` writes
    the file there, so it is no error)."""
    job_models()
    user = user_models_path()
    if os.environ.get(MODELS_ENV) and not (user.exists() or user.is_symlink()):
        print(
            f"pipesgd: note: ${MODELS_ENV} names {user}, which does not exist; "
            f"auto chooses by the package's figures (`pipesgd bench allreduce --fit` writes "
            f"that file)",
            file=sys.stderr,
        )


def fitted(transport: str) -> dict[str, tuple[float, float]]:
    """{algorithm: (alpha, beta)} fitted on this machine for `transport` (job_models: the
    user's file over the package's)."""
    return job_models().get(transport, {})


def available(comm) -> list[str]:
    """The algorithms this job can run (see the module docstring)."""
    names = ["ring"]
    if getattr(comm, "mesh", None):
        names += ["rd", "rab"]
    if getattr(comm, "group", None) is not None:
        names += ["oneshot", "twoshot"]
    return names


SLOWEST_FIRST = ("tcp", "mpi", "unix", "shm")  # the transports, slowest first


def transport_of(comm) -> str:
    """The transport whose figures apply: the job's (`auto_transport`, set at rendezvous: the
    slowest among all its links, from the address table every rank holds), else the ring's
    right link's."""
    if getattr(comm, "auto_transport", None):
        return comm.auto_transport
    right = getattr(comm, "right", None)
    return right.transport if right is not None else "tcp"


def slowest(transports) -> str:
    """The slowest of some links' transports (SLOWEST_FIRST): what an AllReduce that crosses
    all of them waits on."""
    return min(transports, key=lambda t: SLOWEST_FIRST.index(t) if t in SLOWEST_FIRST else 0)


LINK_ALGORITHMS = ("ring", "rd", "rab")  # over links: an emulated link's alpha and B apply


def candidates(grouped: bool) -> list[str]:
    """What `auto` chooses among: one host's group (with the ring), or the link algorithms."""
    return ["ring", "oneshot", "twoshot"] if grouped else list(LINK_ALGORITHMS)


def pick(
    names: list[str],
    p: int,
    nbytes: int,
    figures: dict[str, tuple[float, float]],
    latency: float = 0.0,
    bandwidth: float = math.inf,
) -> str:
    """The fastest of `names` by the fitted models (the ring when none has figures). On an
    emulated link (latency, bandwidth) each link algorithm also pays the link: `steps` latencies
    and `volume` bytes at the link's bandwidth, as the emulation paces them."""
    timed = []
    for n in names:
        if n not in figures:
            continue
        t = model_time(n, p, nbytes, *figures[n])
        if n in LINK_ALGORITHMS:
            t += steps(n, p, nbytes) * latency + volume(n, p) * nbytes / bandwidth
        timed.append((t, n))
    return min(timed)[1] if timed else "ring"


def algorithm_for(comm, nbytes: int, asked: str | None = None) -> str:
    """The algorithm this rank runs for a message of nbytes: `asked`, else the job's
    (`JobSpec.allreduce`); "auto" picks by the fitted models. Asking for one the job cannot run
    is a ValueError saying what it needs."""
    spec = getattr(comm, "spec", None)
    asked = asked or getattr(spec, "allreduce", "ring")
    p = comm.world_size
    if asked == "auto":
        if p == 1:
            return "ring"
        # The same inputs give the same answer: each size is chosen once per communicator,
        # not once per call (the figures are read and the models evaluated the first time).
        chosen = comm.__dict__.setdefault("_auto_choices", {})
        if nbytes not in chosen:
            chosen[nbytes] = _choose(comm, spec, p, nbytes)
        return chosen[nbytes]
    if asked not in NAMES:
        raise ValueError(f"allreduce algorithm must be one of {', '.join(NAMES)}, got {asked!r}")
    if p > 1 and asked not in available(comm):
        if asked in ("rd", "rab"):
            need = "links (--allreduce rd, rab or auto)"
        else:
            need = "shared-memory group (--allreduce oneshot, twoshot or auto; one host; shm)"
        raise ValueError(f"allreduce {asked!r} needs the job to be started with its {need}")
    return asked


def _choose(comm, spec, p: int, nbytes: int) -> str:
    """auto's pick for one message size (see `algorithm_for`): from the figures the job
    agreed on at rendezvous (`comm.auto_models`; read here, once per communicator, when it was
    made without one) and the job's transport, so every rank picks alike."""
    link = getattr(spec, "link", None)
    emulated = link is not None and link.enabled
    latency, bandwidth = (link.latency, link.bandwidth) if link and emulated else (0.0, math.inf)
    if getattr(comm, "auto_models", None) is None:
        comm.auto_models = job_models()
    figures = comm.auto_models.get(transport_of(comm), {})
    return pick(available(comm), p, nbytes, figures, latency, bandwidth)
