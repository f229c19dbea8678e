"""The wire under every algorithm: framed TCP links, rendezvous, link emulation, collectives.

transport.py    Link: framed messages over one TCP socket, timeouts, errors naming the peer
rendezvous.py   rank 0's small store: address exchange, job token, ring and star links
netem.py        link emulation: latency alpha and bandwidth B per link and direction
frames.py       the collectives' frames: one header per step and segment, checked on arrival;
                a failure told to both neighbours
schedule.py     the ring's index math and its one-process simulations
ring.py         the ring AllReduce loop (reduce-scatter + all-gather) and its cost; allreduce,
                all-gather, broadcast, barrier on it
compressed_ring.py  the ring with a codec on every hop: decode, add, re-encode
device_ring.py  the ring of a GPU array: chunks through pinned host buffers, added on the GPU
shm_hop.py      a reduce-scatter hop over shared memory: added straight into the next slot
ps.py           the parameter server's wire protocol and client, over the star links
mpi.py          the same frames as MPI messages (--comm mpi): the ring and the star over mpi4py
"""
