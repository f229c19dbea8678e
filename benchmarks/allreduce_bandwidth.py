"""Ring AllReduce bandwidth: ours against the point-to-point TCP limit and gloo (if installed).

    python benchmarks/allreduce_bandwidth.py                      # 4 ranks, 4KB..64MB, loopback
    python benchmarks/allreduce_bandwidth.py --latency 2ms --bandwidth 100MB

The same as `pipesgd bench allreduce` (all its flags work here); prints the table and, with
--json FILE, writes it. Figures go to README.md with the command that produced them.
"""

import sys

from pipesgd_ref.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "allreduce", *sys.argv[1:]]))
