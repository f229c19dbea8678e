"""A real network on one machine: p "hosts" (network namespaces) on a shaped Ethernet, running
ring AllReduce and `pipe` training across it, beside the timing model and the project's own
link emulation of the same latency and bandwidth.

    sudo .venv/bin/python benchmarks/netns_cluster.py                  # 4 hosts, 100 Mbit/s
    sudo .venv/bin/python benchmarks/netns_cluster.py --rate 200mbit --json out.json
    sudo .venv/bin/python benchmarks/netns_cluster.py --delay 1ms   # where the kernel has netem

Needs root and iproute2 (`ip`, `tc`). The network, for a run whose process id is N:

    namespace psgd-N-i    lo up; eth0 = 10.77.X.(i+1)/24, one end of a veth pair ("cable")
    root namespace        bridge psgdNbr ("switch") joining the other ends psgdNh0, psgdNh1, ...

Each host's egress (its eth0, inside its namespace) is shaped by the kernel: `tc qdisc ...
netem delay D rate R` where the kernel has netem (detected by trying it), else `tbf rate R` (a
token bucket: rate only; no added delay, so the latency is what the veth pair, TCP and Python
cost per message). The ring sends every byte to the right neighbour, so host i's egress is the
link i -> i+1 in one direction: one shaping point per link direction, full duplex, as the
model assumes.

Then, with the same sizes and the same network:

    1. measured: `pipesgd bench allreduce` joined across the namespaces (RANK, WORLD_SIZE,
       MASTER_ADDR = host 0, MASTER_PORT, PIPESGD_JOB_TOKEN; --bind to each host's address),
       one `ip netns exec psgd-N-i python -m pipesgd_ref ...` per rank; rank 0's --json has
       the times (median over repeats of rank 0's AllReduce).
    2. model: equation (1) of docs/paper.md (timing.ring_allreduce_time),

           T_ar = 2(p-1) alpha + 2(p-1)/p * M/B + (p-1)/p * M gamma

       B = the shaped rate's TCP payload (`tcp_goodput`: the frames' headers and the ACKs of
       the reverse flow ride the same shaper), alpha from a 1 KB AllReduce across the same
       namespaces (median of 40; T = 2(p-1) alpha there), gamma timed here
       (timing.measure.measure_gamma).
    3. emulated: the same AllReduce on loopback with the project's emulation (--latency D
       --bandwidth B, the same figures).

and the same three for `pipesgd train --algo=pipe` (rank 0's summary.json iter_time_s; the
model is timing.predict with t_comp and t_u timed here). Sizes and rate are chosen so the wire
dominates the CPU (1-4 MB at 100 Mbit/s: 0.1-0.5 s of wire per AllReduce against a few ms of
copies and additions; a 1.4 MB gradient: 180 ms of wire against 2-5 ms of computing), so a 15%
agreement means something on a shared 2-core machine.

What it cannot show here: this kernel has no netem, so the links add no delay and alpha is the
software's own (0.2-1 ms a hop on the loaded 2-core machine). And tbf passes TCP's 64 KB
packets whole (see NetnsCluster.burst_s), so a link catches up on short idle gaps: the
measured times lack part of the 2(p-1) alpha of the model and of the emulation, which puts
them 2-5% below both (measured; see README.md).

Everything it makes is torn down on every path (try/finally); leftovers of earlier runs whose
process is gone are removed at start; every subprocess has a timeout. The functions are
importable: tests/faults/test_netns.py builds the same network with them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PREFIX = "psgd"  # every namespace, bridge and veth this script makes starts with it
CMD_TIMEOUT = 10.0  # seconds for one `ip` or `tc` command
MASTER_PORT = 29500  # rank 0's store: host 0's namespace is private, so the port is free there
TCP_IP_HEADERS = 20 + 20 + 12  # IPv4 + TCP + timestamps option (Linux default): MSS = MTU - 52
ETH_HEADER = 14  # what tc counts on top of the IP packet (no preamble, FCS or gap on a veth)
ACK_BYTES = ETH_HEADER + TCP_IP_HEADERS  # a pure ACK frame
ACKS_PER_SEGMENT = 0.5  # Linux acknowledges every second full-sized segment (RFC 1122)
GSO_BYTES = 65536  # the largest packet TCP hands a veth at once (`ip -d link`: gso_max_size)
REPO = Path(__file__).resolve().parent.parent
# The p ranks share this machine's cores. Local workers limit BLAS to one thread each
# (jobenv.pin_to_core); a joined rank does not, and p ranks x C BLAS threads on C cores spin
# against each other (a step a hundred times slower: benchmarks/RESULTS.md).
ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# What a launcher may have left in our environment (inside sbatch or mpirun, say): no run here
# may inherit it and join a job it does not belong to.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "PIPESGD_JOB_TOKEN")  # fmt: skip


# --- commands -------------------------------------------------------------------------------


class NetnsError(RuntimeError):
    """Building the network or running a job on it failed; the message says where and why."""


def sh(*argv: str, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    """Run one command (never through a shell), bounded in time."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {done.returncode}): "
                         f"{done.stderr.strip()}")  # fmt: skip
    return done


def missing_requirements() -> str | None:
    """Why this machine cannot build the network (the reason for a skip), or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root: network namespaces, veth pairs and tc qdiscs are privileged"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2: `{tool}` is not on PATH"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        sh("ip", "netns", "add", probe)
        sh("ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up")
    except NetnsError as e:
        return f"cannot create and enter a network namespace here ({e})"
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (sch_netem). Tried on lo of a scratch namespace:
    `tc` says "Specified qdisc kind is unknown" only when asked."""
    probe = f"{PREFIX}-{os.getpid()}-netem"
    try:
        sh("ip", "netns", "add", probe)
        done = sh("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                  "netem", "delay", "1ms", check=False)  # fmt: skip
        return done.returncode == 0
    except NetnsError:
        return False
    finally:
        sh("ip", "netns", "del", probe, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, someone else's
        return True
    return True


def cleanup_leftovers() -> list[str]:
    """Remove namespaces and links of earlier runs whose process is gone (a run killed before
    its `finally`); the process id in every name keeps a live run's network out of reach.
    Returns the names removed."""
    removed = []
    for name in sh("ip", "netns", "list", check=False).stdout.split():
        m = re.fullmatch(rf"{PREFIX}-(\d+)-\w+", name)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_processes(name)
            sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    links = sh("ip", "-o", "link", "show", check=False).stdout
    for m in re.finditer(rf"^\d+: ({PREFIX}(\d+)(?:br|h\d+))[@:]", links, re.M):
        if not _pid_alive(int(m.group(2))):
            sh("ip", "link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


def _kill_namespace_processes(ns: str) -> None:
    """Stop whatever still runs inside one of our namespaces (only our ranks ever do)."""
    for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


def pin(rank: int) -> list[str]:
    """`taskset -c CORE`: rank r on core r mod the cores we may use, as launch_local pins its
    workers (jobenv.pin_to_core), so the namespaces' ranks share the cores the way the
    emulated run's do. Nothing where taskset is missing."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cores or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(cores[rank % len(cores)])]


# Both runs that are compared (the ranks across the namespaces, and the emulated run's launcher
# and workers) run at this nice value where we may raise priority (root: the network needs it
# anyway): they time the network and its emulation, not whatever else loads the machine. At
# nice 0 beside two busy loops on the 2-core machine (benchmarks/stress_faults.sh), the `pipe`
# iteration across the namespaces read +26% over the model and the emulated 1 MB AllReduce
# took 1.23x the namespaces' time; at -10, with more work of other users beside the loops, the
# emulated one still took 1.21x once in 2 runs. At -20 a nice-0 process weighs 1/87 of a rank
# (the kernel's CFS weights 1024 and 88761), so ten of them take a tenth of a core.
NICE = -20


def boost() -> list[str]:
    """`nice -n NICE` where this process may raise priority (root), else nothing."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("nice") is None:
        return []
    return ["nice", "-n", str(NICE)]


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment less any launcher's variables, one BLAS thread, the checkout importable
    (an uninstalled one too), and `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **ONE_BLAS_THREAD, **extra}


# --- the network ----------------------------------------------------------------------------


def tcp_goodput(rate_bps: float, mtu: int = 1500) -> float:
    """Bytes/s of TCP payload through a shaper of `rate_bps` bits/s that counts whole frames.

    A full segment carries MSS = MTU - 52 payload bytes in an MTU + 14 byte frame; the same
    shaper also carries the ACKs of the flow coming the other way (from the left neighbour),
    one 66-byte frame per two segments. Per payload byte the shaper sends (MTU + 14 + 33) / MSS
    bytes: 1.068 at MTU 1500 (measured with `tc -s qdisc` over a ring AllReduce: 1.063)."""
    mss = mtu - TCP_IP_HEADERS
    return rate_bps / 8 * mss / (mtu + ETH_HEADER + ACKS_PER_SEGMENT * ACK_BYTES)


def parse_rate(text: str) -> float:
    """Bits/s of a tc-style rate ("100mbit", "1gbit", "500kbit")."""
    from pipesgd_ref.units import parse_bandwidth

    return parse_bandwidth(text) * 8


@dataclass
class NetnsCluster:
    """p namespaces on one bridge, each egress shaped; `up()` builds, `down()` removes it all.
    As a context manager the network is gone when the block ends, however it ends."""

    world_size: int
    rate_bps: float  # bits/s each host sends at (its link to the right neighbour)
    delay: float = 0.0  # s of one-way kernel delay per link (needs netem; 0: none)
    mtu: int = 1500
    # tbf's bucket, in seconds of the rate, and never below one TSO/GSO packet (GSO_BYTES). A
    # packet larger than the bucket is cut into MTU-sized frames by tbf, and each frame then
    # crosses the veth, the bridge and TCP on its own: with a 25-50 KB bucket the kernel's
    # per-frame work took a quarter of this (loaded) 2-core machine and a 200 Mbit/s ring ran
    # 8-84% slower than its rate allows; with 64 KB packets passing whole (as a NIC with TSO
    # takes them) it ran within 5%. A deeper bucket also forgives the shaper's own late
    # wake-ups (it can only send when the kernel runs it; a NIC sends from its ring while the
    # CPU is busy elsewhere). The price: a link idle for less than a bucket's worth catches up
    # afterwards, so the per-hop software latency (alpha) partly vanishes from measured
    # times: at most 2(p-1) alpha per AllReduce, 1-4% here.
    burst_s: float = 2e-3
    tag: str = field(default_factory=lambda: str(os.getpid()))
    netem: bool | None = None  # None: detect
    made: list[tuple[str, str]] = field(default_factory=list)  # ("netns" | "link", name)

    def __post_init__(self):
        if not 2 <= self.world_size <= 250:
            raise ValueError(f"world_size must be 2..250, got {self.world_size}")
        # 10.77.X.0/24, X from the tag: two live clusters never share a subnet (they are on
        # separate bridges anyway, and the root namespace has no address on either).
        self.subnet = f"10.77.{int(self.tag) % 250 + 1}"

    def ns(self, i: int) -> str:
        return f"{PREFIX}-{self.tag}-{i}"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"  # interface names have 15 characters at most

    def host_end(self, i: int) -> str:
        return f"{PREFIX}{self.tag}h{i}"

    @property
    def bandwidth(self) -> float:
        """B of the model: payload bytes/s a host moves to its neighbour."""
        return tcp_goodput(self.rate_bps, self.mtu)

    def up(self) -> NetnsCluster:
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        if self.netem is None:
            self.netem = netem_available()
        if self.delay > 0 and not self.netem:
            raise NetnsError(
                f"a kernel delay of {self.delay * 1e3:g} ms needs the netem qdisc, which this "
                f"kernel lacks (tc: 'Specified qdisc kind is unknown'); run with --delay 0, or "
                f"on a kernel with sch_netem"
            )
        sh("ip", "link", "add", "name", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.world_size):
            ns, host = self.ns(i), self.host_end(i)
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            # A veth pair is a cable: one end on the bridge, the other the host's eth0.
            # Deleting the namespace deletes both ends.
            sh("ip", "link", "add", host, "mtu", str(self.mtu), "type", "veth",
               "peer", "name", "eth0", "netns", ns)  # fmt: skip
            self.made.append(("link", host))
            sh("ip", "link", "set", host, "master", self.bridge, "up")
            inside = ("ip", "netns", "exec", ns)
            sh(*inside, "ip", "link", "set", "lo", "up")
            sh(*inside, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            sh(*inside, "ip", "link", "set", "eth0", "up")
            sh(*inside, "tc", "qdisc", "add", "dev", "eth0", "root", *self.qdisc())

    def qdisc(self) -> list[str]:
        """Every host's egress qdisc: netem (delay and rate) where the kernel has it, else a
        token bucket (rate only). (Untried here: this machine's kernel has no netem. A delay
        held in the sender's own qdisc counts against TCP's small-queue limit, about 1 MB a
        socket on recent kernels, so keep delay x rate well below it.)"""
        rate = f"{self.rate_bps:.0f}bit"
        if self.netem:
            # limit (packets): the bandwidth-delay product and 50 ms of queue, as tbf's below
            limit = max(1000, int(self.rate_bps / 8 * (self.delay + 0.05) / self.mtu))
            return ["netem", "delay", f"{self.delay * 1e6:.0f}us", "rate", rate,
                    "limit", str(limit)]  # fmt: skip
        # tbf counts a GSO packet as the frames it becomes: its headers once per segment
        segments = -(-GSO_BYTES // (self.mtu - TCP_IP_HEADERS))
        gso_frames = GSO_BYTES + segments * (ETH_HEADER + TCP_IP_HEADERS)
        burst = max(gso_frames + self.mtu, int(self.rate_bps / 8 * self.burst_s))
        # latency: how long a packet may queue before it is dropped; TCP's small-queue limit
        # keeps the queue far shorter (no drops measured).
        return ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]

    def down(self) -> None:
        """Remove everything `up` made (safe twice, and after a partial `up`)."""
        for kind, name in self.made:
            if kind == "netns":
                _kill_namespace_processes(name)
        # Links first: deleting a veth end deletes its pair at once, where a deleted namespace
        # takes its interfaces down in the background (a rebuild could find the names taken).
        for kind, name in reversed(self.made):
            if kind == "link":
                sh("ip", "link", "del", name, check=False)
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
        self.made.clear()

    def __enter__(self) -> NetnsCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def describe(self) -> str:
        from pipesgd_ref.units import format_bandwidth

        shaper = "netem" if self.netem else "tbf (this kernel has no netem: no added delay)"
        return (
            f"{self.world_size} namespaces {self.ns(0)}..{self.world_size - 1} on bridge "
            f"{self.bridge}, {self.subnet}.1..{self.world_size}/24; egress {shaper} at "
            f"{self.rate_bps / 1e6:g} Mbit/s, TCP payload {format_bandwidth(self.bandwidth)}"
            + (f", delay {self.delay * 1e3:g} ms" if self.delay else "")
        )

    def run_job(self, args: list[str], per_rank=None, timeout: float = 60.0) -> list[str]:
        """Run `python -m pipesgd_ref ARGS` as rank i in namespace i, for every i, joined by
        the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, PIPESGD_JOB_TOKEN);
        `per_rank(i)` adds rank i's own arguments. Returns every rank's output; raises
        NetnsError with the failed ranks' output. Whatever runs after `timeout` s is killed."""
        token = secrets.token_hex(16)
        procs: list[tuple[subprocess.Popen, object]] = []
        outputs = []
        try:
            for i in range(self.world_size):
                env = clean_env(RANK=str(i), WORLD_SIZE=str(self.world_size),
                                MASTER_ADDR=self.addr(0), MASTER_PORT=str(MASTER_PORT),
                                PIPESGD_JOB_TOKEN=token)  # fmt: skip
                argv = ["ip", "netns", "exec", self.ns(i), *boost(), *pin(i), sys.executable, "-m",
                        "pipesgd_ref", *args, *(per_rank(i) if per_rank else [])]  # fmt: skip
                log = tempfile.TemporaryFile("w+")  # a file, not a pipe: it never fills up
                proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log,
                                        stderr=subprocess.STDOUT)  # fmt: skip
                procs.append((proc, log))
            deadline = time.monotonic() + timeout
            for proc, _ in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for proc, log in procs:  # ip netns exec and taskset exec: the pid is the rank's
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
                log.seek(0)
                outputs.append(log.read())
                log.close()
        failed = [i for i, (proc, _) in enumerate(procs) if proc.returncode != 0]
        if failed:
            why = []
            for i in failed:
                code = procs[i][0].returncode
                killed = f" (killed at the {timeout:.0f} s timeout)" if code == -9 else ""
                why.append(f"--- rank {i} in {self.ns(i)}, exit {code}{killed}:\n"
                           f"{outputs[i][-2000:]}")  # fmt: skip
            raise NetnsError(f"ranks {failed} of the job across the namespaces failed:\n"
                             + "\n".join(why))  # fmt: skip
        return outputs


def run_local(args: list[str], what: str, timeout: float) -> str:
    """Run `python -m pipesgd_ref ARGS` here (local workers, loopback); return its output."""
    argv = [*boost(), sys.executable, "-m", "pipesgd_ref", *args]
    try:
        done = subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{what} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise NetnsError(f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    return done.stdout


# --- ring AllReduce -------------------------------------------------------------------------


def bench_args(sizes: list[int], reps: int, warmup: int, timeout: float) -> list[str]:
    return ["bench", "allreduce", "--sizes", ",".join(str(s) for s in sizes), "--reps",
            str(reps), "--warmup", str(warmup), "--timeout", str(timeout)]  # fmt: skip


def allreduce_across(cluster: NetnsCluster, sizes: list[int], reps: int = 5, warmup: int = 1,
                     timeout: float = 60.0) -> dict[int, float]:  # fmt: skip
    """{size: s} of the ring AllReduce across the namespaces (rank 0's median of `reps`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"

        def per_rank(i: int) -> list[str]:
            return ["--bind", cluster.addr(i), *(["--json", str(out)] if i == 0 else [])]

        cluster.run_job(bench_args(sizes, reps, warmup, timeout / 2), per_rank, timeout)
        rows = json.loads(out.read_text())["rows"]
    bad = [r["size_bytes"] for r in rows if not r["verified_rank0"]]
    if bad:
        raise NetnsError(f"the AllReduce across the namespaces gave wrong sums at sizes {bad}")
    return {r["size_bytes"]: r["time_s"] for r in rows}


def allreduce_emulated(world_size: int, sizes: list[int], latency: float, bandwidth: float,
                       reps: int = 5, warmup: int = 1,
                       timeout: float = 60.0) -> dict[int, float]:  # fmt: skip
    """{size: s} of the same AllReduce among local workers on loopback, the link emulated by
    the project (--latency s, --bandwidth bytes/s); the slowest rank's median of `reps`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "emulated.json"
        run_local([*bench_args(sizes, reps, warmup, timeout / 2), "--world-size",
                   str(world_size), "--latency", repr(latency), "--bandwidth", repr(bandwidth),
                   "--no-gloo", "--json", str(out)], "the emulated AllReduce", timeout)  # fmt: skip
        rows = json.loads(out.read_text())["rows"]
    return {r["size_bytes"]: r["time_s"] for r in rows}


def probe_alpha(world_size: int, t_probe: float, probe_bytes: int, bandwidth: float) -> float:
    """alpha from a tiny AllReduce: T = 2(p-1) alpha + 2(p-1)/p M/B, solved for alpha."""
    p = world_size
    wire = 2 * (p - 1) / p * probe_bytes / bandwidth
    return max(t_probe - wire, 0.0) / (2 * (p - 1))


@dataclass
class Row:
    what: str  # "4.0 MB" (an AllReduce of that size) or "pipe, 1.4 MB" (training, gradient)
    measured_s: float  # across the namespaces
    model_s: float  # the timing model of the shaped network
    emulated_s: float  # loopback, the project's emulation of the same latency and bandwidth

    @property
    def error(self) -> float:
        """measured / model - 1."""
        return self.measured_s / self.model_s - 1

    @property
    def ratio(self) -> float:
        """namespaces / emulated."""
        return self.measured_s / self.emulated_s

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error, "ratio": self.ratio}


@dataclass
class Network:
    """The figures of the shaped network the models use, and how each was obtained."""

    world_size: int
    alpha: float  # s per hop: a 1 KB AllReduce across the namespaces / 2(p-1)
    bandwidth: float  # bytes/s: tcp_goodput of the shaped rate
    gamma: float  # s per byte added: timing.measure.measure_gamma here
    latency: float  # s the emulation adds per message: the kernel's delay (netem), else 0


PROBE_BYTES, PROBE_REPS = 1024, 40


def compare_allreduce(cluster: NetnsCluster, sizes: list[int], reps: int = 5, warmup: int = 1,
                      timeout: float = 60.0) -> tuple[list[Row], Network]:  # fmt: skip
    """The AllReduce of every size across the namespaces, modelled, and emulated on loopback."""
    from pipesgd_ref.timing import ring_allreduce_time
    from pipesgd_ref.timing.measure import measure_gamma
    from pipesgd_ref.units import format_bytes

    p, B = cluster.world_size, cluster.bandwidth
    # A job of its own for the probe: its median of PROBE_REPS (a few ms each) stays put where
    # a median of 5 moved with the machine's load (benchmarks/RESULTS.md).
    probe = allreduce_across(cluster, [PROBE_BYTES], PROBE_REPS, warmup, timeout)[PROBE_BYTES]
    measured = allreduce_across(cluster, sizes, reps, warmup, timeout)
    net = Network(p, probe_alpha(p, probe, PROBE_BYTES, B), B, measure_gamma(), cluster.delay)
    emulated = allreduce_emulated(p, sizes, net.latency, B, reps, warmup, timeout)
    rows = [Row(format_bytes(m), measured[m], ring_allreduce_time(p, m, net.alpha, B, net.gamma),
                emulated[m]) for m in sizes]  # fmt: skip
    return rows, net


# --- `pipe` training ------------------------------------------------------------------------

# A network-bound `pipe` run of a few seconds: synthetic data (no sklearn import per rank: 2 s
# each on a loaded machine) on an MLP 32-8192-10, 352k parameters, a 1.4 MB gradient. At
# 100 Mbit/s one AllReduce of it is ~180 ms of wire against 2-5 ms of computing, so the
# iteration is the AllReduce: T_pipe = max(t_c + t_u, T_ar) = T_ar.
# The ring on both sides: across the namespaces auto would choose among the link algorithms
# for tcp, on loopback with the emulated link among them too, but from other fitted figures;
# the comparison is of the same run carried two ways, so both run the same algorithm.
TRAIN_OVERRIDES = ("--algo=pipe", "--dataset=synthetic", "--hidden=8192", "--steps=30",
                   "--eval-every=0", "--allreduce=ring")  # fmt: skip


def train_args(overrides, world_size: int, timeout: float, out: Path) -> list[str]:
    return ["train", "--preset", "laptop", "--no-progress", "--log-level", "WARNING",
            *overrides, f"--world-size={world_size}", f"--timeout={timeout:g}",
            f"--out={out}"]  # fmt: skip


def train_across(cluster: NetnsCluster, overrides=TRAIN_OVERRIDES, timeout: float = 90.0) -> dict:
    """Rank 0's summary.json of `pipesgd train` joined across the namespaces."""
    with tempfile.TemporaryDirectory() as tmp:
        args = train_args(overrides, cluster.world_size, timeout / 3, Path(tmp))
        cluster.run_job(args, lambda i: ["--bind", cluster.addr(i)], timeout)
        return json.loads((Path(tmp) / "summary.json").read_text())


def train_emulated(world_size: int, latency: float, bandwidth: float, overrides=TRAIN_OVERRIDES,
                   timeout: float = 90.0) -> dict:  # fmt: skip
    """summary.json of the same `pipesgd train` among local workers, link emulated."""
    with tempfile.TemporaryDirectory() as tmp:
        link = [f"--latency={latency!r}", f"--bandwidth={bandwidth!r}"]
        args = train_args([*overrides, *link], world_size, timeout / 3, Path(tmp))
        run_local(args, "the emulated training", timeout)
        return json.loads((Path(tmp) / "summary.json").read_text())


def train_config(world_size: int, overrides=TRAIN_OVERRIDES):
    """The TrainConfig `pipesgd train --preset laptop OVERRIDES` runs."""
    from pipesgd_ref.commands.parser import split_overrides
    from pipesgd_ref.config import TrainConfig, apply_overrides

    args = split_overrides([*overrides, f"--world-size={world_size}"])
    return apply_overrides(TrainConfig.preset("laptop"), args)


def predict_training(net: Network, overrides=TRAIN_OVERRIDES) -> tuple[float, int]:
    """timing.predict's iteration time of the run on this network (and the model's parameter
    count): t_comp and t_u timed in this process, alpha, B and gamma of the network, the
    cores this process may use."""
    from pipesgd_ref.timing import Calibration, predict
    from pipesgd_ref.timing.measure import time_compute, usable_cores

    cfg = train_config(net.world_size, overrides)
    n, t_comp, t_update = time_compute(cfg)
    cal = Calibration(n_params=n, t_comp=t_comp, t_update=t_update, alpha=net.alpha,
                      bandwidth=net.bandwidth, gamma=net.gamma, cores=usable_cores())  # fmt: skip
    return predict(cfg.algo, cfg.world_size, cal, width=cfg.width).iter_time_s, n


def compare_training(cluster: NetnsCluster, net: Network, overrides=TRAIN_OVERRIDES,
                     timeout: float = 90.0) -> tuple[Row, dict, dict]:  # fmt: skip
    """`pipesgd train` across the namespaces, modelled and emulated on loopback: the Row of
    iteration times, and the two summaries."""
    cfg = train_config(cluster.world_size, overrides)
    from pipesgd_ref.units import format_bytes

    across = train_across(cluster, overrides, timeout)
    emulated = train_emulated(cluster.world_size, net.latency, net.bandwidth, overrides, timeout)
    model_s, n_params = predict_training(net, overrides)
    label = f"{cfg.algo}, {format_bytes(4 * n_params)}"  # the gradient an iteration reduces
    return Row(label, across["iter_time_s"], model_s, emulated["iter_time_s"]), across, emulated


# --- the report -----------------------------------------------------------------------------


def format_table(rows: list[Row]) -> str:
    lines = [f"{'':>16} {'namespaces ms':>14} {'model ms':>9} {'error':>7} "
             f"{'emulated ms':>12} {'ns/emulated':>12}"]  # fmt: skip
    for r in rows:
        lines.append(f"{r.what:>16} {r.measured_s * 1e3:14.1f} {r.model_s * 1e3:9.1f} "
                     f"{r.error:+7.1%} {r.emulated_s * 1e3:12.1f} {r.ratio:12.3f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pipesgd_ref.units import format_seconds, parse_latency, parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=4, help="namespaces (hosts), default 4")
    ap.add_argument("--rate", default="100mbit", help="tc rate of every link and direction")
    ap.add_argument("--delay", default="0", help="kernel delay per link (needs netem), e.g. 1ms")
    ap.add_argument("--sizes", default="1MB,2MB,4MB", help="AllReduce sizes")
    ap.add_argument("--reps", type=int, default=5, help="timed AllReduces per size")
    ap.add_argument("--warmup", type=int, default=1, help="untimed AllReduces per size")
    ap.add_argument("--no-train", action="store_true", help="the AllReduce only")
    ap.add_argument("--timeout", type=float, default=120.0, help="limit of each job, s")
    ap.add_argument("--json", dest="json_path", help="also write the results here")
    args = ap.parse_args(argv)
    reason = missing_requirements()
    if reason:
        print(f"netns_cluster: {reason}", file=sys.stderr)
        return 2
    gone = cleanup_leftovers()
    if gone:
        print(f"removed leftovers of earlier runs: {', '.join(gone)}")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    cluster = NetnsCluster(args.world_size, parse_rate(args.rate), parse_latency(args.delay))
    with cluster:
        print(cluster.describe())
        rows, net = compare_allreduce(cluster, sizes, args.reps, args.warmup, args.timeout)
        print(f"model: alpha {format_seconds(net.alpha)} (a {PROBE_BYTES} B AllReduce across "
              f"the namespaces / {2 * (net.world_size - 1)}), B {net.bandwidth / 1e6:.2f} MB/s, "
              f"gamma {net.gamma * 1e9:.2f} ns/B; emulated: --latency "
              f"{format_seconds(net.latency)} --bandwidth {net.bandwidth:.0f} "
              f"(bytes/s)")  # fmt: skip
        if not args.no_train:
            row, _, _ = compare_training(cluster, net, timeout=args.timeout)
            rows.append(row)
    print(format_table(rows))
    print(f"worst |error| against the model {max(abs(r.error) for r in rows):.1%}, "
          f"against the emulation {max(abs(r.ratio - 1) for r in rows):.1%}")  # fmt: skip
    if args.json_path:
        payload = {"rate_bps": cluster.rate_bps, "delay_s": cluster.delay,
                   "netem": cluster.netem, "network": asdict(net),
                   "rows": [r.to_dict() for r in rows]}  # fmt: skip
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
