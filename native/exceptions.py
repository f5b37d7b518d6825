"""The errors collectives raise when ranks disagree: a leaf module, so the check mode can raise
them without importing the communicator (:mod:`native.errors` re-exports them)."""


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, sizes or dtypes (raised on every rank)."""


class CollectiveTimeoutError(CollectiveMismatchError):
    """In check mode, a rank never arrived at the collective the others are in."""
