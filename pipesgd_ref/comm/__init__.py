"""The wire under every algorithm: framed TCP links, rendezvous, link emulation, collectives.

transport.py   Link: framed messages over one TCP socket, timeouts, errors naming the peer
rendezvous.py  rank 0's small store: address exchange, job token, ring links
netem.py       link emulation: latency alpha and bandwidth B per link and direction
ring.py        ring AllReduce (reduce-scatter + all-gather), broadcast, barrier
"""
