"""The wire under every algorithm: framed TCP links, rendezvous, link emulation, collectives.

wire.py         the frame: a 48-byte header and raw bytes; the checks every frame passes
links.py        Link: framed messages over one TCP or unix socket, timeouts, errors naming the
                peer; sender.py its sending thread; shm.py the payloads through shared memory
communicator.py what a method holds: a rank's ring and star links, failure news round the ring
rendezvous.py   rank 0's small store: address exchange, job token, ring and star links;
                sockets.py its listeners and connections
activity.py     what this rank is doing: named where an operation starts, read by its errors
netem.py        link emulation: latency alpha and bandwidth B per link and direction
frames.py       the collectives' frames: one header per step and segment, checked on arrival;
                a failure told to both neighbours
schedule.py     the ring's index math and its one-process simulations
collectives.py  the job's AllReduce: its checks, the algorithm the job asked for (choose.py
                picks under auto) run on this rank, and the tally of what ran; allgather
ring.py         the ring AllReduce loop (reduce-scatter + all-gather) and its cost; the ring's
                allreduce, broadcast and barrier
compressed_ring.py  the ring with a codec on every hop: decode, add, re-encode
device_ring.py  the ring of a GPU array: chunks through pinned host buffers, added on the GPU
shm_hop.py      a reduce-scatter hop over shared memory: added straight into the next slot
mesh.py         recursive doubling and Rabenseifner over mesh links; algorithms.py their
                schedules, one-process simulation and costs
shm_group.py    one host's shared-memory group: oneshot and twoshot
choose.py       which algorithm a message takes under auto: the fitted alpha-beta models
ps.py           the parameter server's two ends: the worker's client, the server's links
ps_wire.py      the parameter server's messages: start, push, pull, abort; their buffers
mpi.py          the same collectives over MPI (--comm mpi): the ring and the star over mpi4py;
                mpi_links.py the frames as MPI messages
"""
