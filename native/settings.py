"""Settings read from the environment (``mpirun`` forwards it to every rank).

One place that turns ``HISTFOREST_*`` variables into numbers, so every setting
rejects a bad value the same way: one line naming the variable.
"""
import os


def positive_number(name, default, kind=float, unit=""):
    """The value of environment variable ``name`` as a number > 0, or ``default`` if unset.

    Parameters
    ----------
    name : str
    default : number or None
    kind : type
        ``float`` or ``int``.
    unit : str
        Words for the error message (e.g. ``"a number of seconds"``).

    Raises
    ------
    ValueError
        If the variable is set to something else than a number > 0.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    what = unit or ("a positive integer" if kind is int else "a positive number")
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be {what} (> 0), got {raw!r}")
    return value


def flag(name, default, environ=None, strict=False):
    """Environment variable ``name`` as a switch: unset or empty gives ``default``;
    ``0``, ``false``, ``no``, ``off`` (any case) give False; anything else True, or
    with ``strict`` only ``1``, ``true``, ``yes``, ``on`` (others raise ``ValueError``
    naming the variable). ``environ`` defaults to ``os.environ``."""
    raw = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if not raw:
        return default
    if strict and raw not in ("0", "false", "no", "off", "1", "true", "yes", "on"):
        raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")
    return raw not in ("0", "false", "no", "off")
