"""What a rank's main thread is doing in MPI: written by the communicator, read by the watchdog.

Below both :mod:`native.comm` and :mod:`native.watchdog`, so neither imports the other
for it.
"""


class Activity:
    """What this rank's main thread is doing in MPI, for :mod:`native.watchdog`.

    Written only by the thread that runs the collectives, read by the watchdog
    thread (plain attribute reads and writes; no lock is needed for a status report).

    Attributes
    ----------
    seq : int
        Public collectives entered so far on this communicator.
    op : str
        Name of the latest one.
    token : int
        Blocking MPI calls started so far (changes whenever the thread gets anywhere).
    peers : tuple of int or None
        Ranks the current blocking call waits for (``(-1,)``: all of them), ``None``
        when the thread is not blocked in MPI.
    """

    def __init__(self):
        self.seq = 0
        self.op = "-"
        self.token = 0
        self.peers = None
