"""pipesgd_ref: a reference implementation of Pipe-SGD (Li et al., NeurIPS 2018).

Decentralized data-parallel SGD whose workers pipeline gradient computation with a ring
AllReduce (width two, staleness one), beside the classic baselines and the timing models that
predict each one's iteration time. See README.md for a tour of the layout.
"""

__version__ = "0.1.0"
