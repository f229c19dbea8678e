"""Naming what differs between the options the ranks of one job were started with.

Both checks that the ranks agree use it: the rendezvous store's, on the options each rank's
hello carries (comm/rendezvous.py: before any link exists, so it holds when --allreduce or
--transport differ), and runtime/agreement.py's, after the job forms (the MPI path).
"""

from __future__ import annotations

SHOWN = 3  # differing options named in the line, at most

__all__ = ["differences", "flags"]


def differences(options: list[dict]) -> str:
    """'--lr 0.1 on ranks 0 and 1 vs 0.5 on rank 2; ...': each option whose value is not the same on
    every rank (rank r's options are options[r]), SHOWN of them at most."""
    keys = sorted(set().union(*options))
    differing = [k for k in keys if any(o.get(k, ...) != options[0].get(k, ...) for o in options)]
    parts = []
    for key in differing[:SHOWN]:
        ranks_of: dict[str, list[int]] = {}
        for rank, o in enumerate(options):
            ranks_of.setdefault(_shown(o.get(key, ...)), []).append(rank)
        values = [f"{v} on rank{'s' * (len(r) > 1)} {_ranks(r)}" for v, r in ranks_of.items()]
        parts.append(f"--{flags([key])[0]} " + " vs ".join(values))
    more = len(differing) - SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def flags(keys) -> list[str]:
    return [k.replace("_", "-") for k in keys]


def _shown(value) -> str:
    if value is ...:
        return "(an option this rank's version lacks)"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "''"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value != "" else "''"


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 4:
        return f"{', '.join(map(str, ranks[:3]))} and {len(ranks) - 3} more"
    return " and ".join(
        [", ".join(map(str, ranks[:-1])), str(ranks[-1])] if ranks[:-1] else [str(ranks[0])]
    )
