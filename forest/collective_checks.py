"""Input checks that every rank passes or fails together.

This module owns the one mechanism by which estimator entry points (``fit``,
``oob_predict``) validate their inputs under ``mpirun``. Without it, a ``ValueError``
raised on one rank (NaN in its share of ``y``, a wrong column count) leaves every
other rank waiting in the next collective; when the user's code catches that error
and carries on, nothing ever aborts the job and it hangs.

Usage::

    with collective_checks(comm) as checks:
        X = ...local validation, may raise...
        checks.share(rows=len(X), features=X.shape[1])
    n_global = sum(s["rows"] for s in checks.summaries)

The block runs this rank's checks; they must not call collectives themselves, since a
rank that failed early would never reach them. On leaving the block every rank
all-gathers one small record (its error, or the summary it shared) in a single
collective, so ranks that passed learn that another failed, and every rank raises the
same :class:`RankInputError` naming the first failing rank and its message. Summaries
(row counts, feature names, treatment levels, weight sums) then let every rank run
the cross-rank checks on identical data, so those also fail identically everywhere
(:func:`require_same` names the rank that disagrees), and they save the collectives
that would otherwise gather the same numbers again.

With one rank (``comm.size == 1``, e.g. ``SelfCommunicator``) nothing is exchanged and
an error propagates unchanged, with the message scikit-learn users know.

The command-line tools have their own version of this policy for whole programs
(:func:`forest.cli.common.agree`), which turns the agreed error into one printed line
and exit status 2.
"""
import contextlib

from native import collectives as col


class RankInputError(ValueError):
    """Bad input on one or more ranks, raised identically on every rank.

    Attributes
    ----------
    ranks : list of int
        The ranks whose input failed, in rank order.
    messages : list of str
        Their error messages (same order).
    """

    def __init__(self, ranks, messages):
        self.ranks = list(ranks)
        self.messages = list(messages)
        text = f"rank {self.ranks[0]}: {self.messages[0]}"
        if len(self.ranks) > 1:
            others = ", ".join(str(r) for r in self.ranks[1:])
            text += f" (input also rejected on rank{'s' if len(self.ranks) > 2 else ''} {others})"
        super().__init__(text)


class AgreedError(ValueError):
    """An error every rank raises together, decided from values all ranks share.

    For failures found after the input checks (e.g. a boosting fit that diverges:
    the trees, and so the test, are the same on every rank). The command-line tools
    report it as their one-line error, as they do a :class:`RankInputError`, instead
    of ending the job as they must for an error that one rank alone may have raised.
    """


#: Attribute set on a one-rank input error raised inside :func:`collective_checks`.
_AGREED_MARK = "_histforest_agreed"


def is_agreed(exc):
    """Whether ``exc`` is an input error that every rank raised together.

    True for a :class:`RankInputError`, an :class:`AgreedError` (the checks after the
    exchange, on values all ranks share), and a ``ValueError`` raised inside
    :func:`collective_checks` on a single rank. The command-line tools print such an
    error as one line on every rank; any other exception may have been raised on one
    rank while the others wait in a collective, and must end the job.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
    """
    return isinstance(exc, (RankInputError, AgreedError)) or bool(getattr(exc, _AGREED_MARK, False))


def _describe(exc):
    """One rank's error as a message other ranks can read."""
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


class _Checks:
    """The object ``collective_checks`` yields: collects this rank's summary."""

    def __init__(self, comm):
        self.comm = comm
        self.summaries = None
        self._summary = None

    def share(self, **summary):
        """Record this rank's summary (small, picklable values) to be all-gathered."""
        self._summary = summary


@contextlib.contextmanager
def collective_checks(comm):
    """Run this rank's input checks; raise the same error on every rank if any rank failed.

    Parameters
    ----------
    comm : native.comm.Communicator

    Yields
    ------
    checks
        ``checks.share(**summary)`` inside the block records this rank's summary;
        after the block ``checks.summaries`` is the list of every rank's summary dict
        (rank order; ``{}`` from a rank that shared nothing).

    Raises
    ------
    RankInputError
        On every rank, when the block raised an ``Exception`` on any rank and
        ``comm.size > 1``. With one rank the block's own exception propagates,
        marked for :func:`is_agreed` when it is a ``ValueError`` (its type and
        message stay what the check raised, as scikit-learn users expect).
    """
    checks = _Checks(comm)
    error = None
    try:
        yield checks
    except Exception as exc:  # noqa: BLE001 - any failure must reach the other ranks
        if comm.size == 1:
            if isinstance(exc, ValueError):
                setattr(exc, _AGREED_MARK, True)
            raise
        error = exc
    summary = checks._summary if checks._summary is not None else {}
    if comm.size == 1:
        checks.summaries = [summary]
        return
    record = (_describe(error), None) if error is not None else (None, summary)
    records = col.allgather_object(comm, record)
    failed = [(r, message) for r, (message, _) in enumerate(records) if message is not None]
    if failed:
        raise RankInputError(*zip(*failed)) from error
    checks.summaries = [s for _, s in records]


def input_error(summaries, rank, message):
    """The error to raise, on every rank, for rank ``rank``'s input found bad after the exchange.

    Parameters
    ----------
    summaries : list of dict
        From :func:`collective_checks` (their number is the number of ranks).
    rank : int
    message : str

    Returns
    -------
    ValueError
        :class:`AgreedError` ``(message)`` with one rank, else :class:`RankInputError`.
    """
    return AgreedError(message) if len(summaries) == 1 else RankInputError([rank], [message])


def require_same(summaries, key, describe):
    """Raise when ranks disagree on ``summaries[r][key]`` (identically on every rank).

    Parameters
    ----------
    summaries : list of dict
        From :func:`collective_checks`.
    key : str
    describe : callable
        ``describe(value) -> str``, e.g. ``lambda d: f"X has {d} features"``.

    Raises
    ------
    RankInputError
        Naming the first rank whose value differs from rank 0's.
    """
    first = summaries[0].get(key)
    for r, summary in enumerate(summaries[1:], start=1):
        if summary.get(key) != first:
            raise input_error(summaries, r, f"{describe(summary.get(key))}, but on rank 0 {describe(first)}")


def total(summaries, key):
    """Sum of ``summaries[r][key]`` in rank order (the same bits on every rank)."""
    out = summaries[0][key]
    for summary in summaries[1:]:
        out = out + summary[key]
    return out
