"""Benchmark data sets: generated deterministically, cached under ``benchmarks/out/``.

This module owns the data every model benchmark reads, so contenders in separate
processes (and ranks under ``mpirun``) see identical rows:

* :func:`higgs_like` - a synthetic stand-in for the HIGGS binary task (28 float
  features: 21 "low-level" kinematic-like columns and 7 "high-level" invariant-mass-like
  columns derived from them; a label whose log-odds mix resonance bumps, interactions
  and thresholds). Cached as ``.npy`` so ranks can ``mmap`` just their block of rows.
* :func:`wager_athey` - the causal design of Wager & Athey (2018, section 5) with a
  main effect added (see the function).
* :func:`dense_interactions` - dense float32 binary task with main effects and pairwise
  interactions at any number of columns (issue 37's GBDT shapes), generated in memory.
* :func:`ihdp` - IHDP semi-synthetic replications: the real IHDP covariates shipped by
  EconML (``econml/data/ihdp/sim.csv``) with outcomes simulated on Hill's (2011)
  response surface B, so the true individual effects and PEHE are known.

Rows are generated in fixed-size chunks, each from its own ``SeedSequence`` child keyed
by (seed, chunk index), so a data set of ``n`` rows is the prefix of any larger one and
generation never needs more than one chunk of scratch memory.
"""
import os
import re

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
CHUNK = 100_000

HIGGS_N_FEATURES = 28
HIGGS_TEST_ROWS = 100_000
_TEST_STREAM = 1_000_000  # chunk keys at or above this belong to the test stream


def _chunk_rng(seed, key):
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(key)]))


# --------------------------------------------------------------------------- HIGGS-like

def _pair_mass(pt_a, eta_a, phi_a, pt_b, eta_b, phi_b):
    """Invariant mass of two massless objects: sqrt(2 pt_a pt_b (cosh d_eta - cos d_phi))."""
    return np.sqrt(2.0 * pt_a * pt_b * (np.cosh(eta_a - eta_b) - np.cos(phi_a - phi_b)))


def _higgs_chunk(rng, n):
    """One chunk of the HIGGS-like task.

    Returns
    -------
    X : ndarray of shape (n, 28), float64
    y : ndarray of shape (n,), float64 in {0, 1}
    p : ndarray of shape (n,), float64
        True P(y = 1 | x) (for the Bayes AUC).
    """
    # Objects: lepton (l), missing energy (m, no eta), jets j1..j4.
    pt = rng.lognormal(mean=0.0, sigma=0.45, size=(n, 6))          # l, m, j1..j4
    eta = np.clip(rng.normal(0.0, 1.0, size=(n, 5)), -2.5, 2.5)    # l, j1..j4
    phi = rng.uniform(-np.pi, np.pi, size=(n, 6))                  # l, m, j1..j4
    btag = rng.choice(np.array([0.0, 1.0, 2.0]), p=[0.6, 0.25, 0.15], size=(n, 4))
    l_pt, m_pt, j_pt = pt[:, 0], pt[:, 1], pt[:, 2:]
    l_eta, j_eta = eta[:, 0], eta[:, 1:]
    l_phi, m_phi, j_phi = phi[:, 0], phi[:, 1], phi[:, 2:]
    zero = np.zeros(n)
    m_jj = _pair_mass(j_pt[:, 0], j_eta[:, 0], j_phi[:, 0], j_pt[:, 1], j_eta[:, 1], j_phi[:, 1])
    m_bb = _pair_mass(j_pt[:, 2], j_eta[:, 2], j_phi[:, 2], j_pt[:, 3], j_eta[:, 3], j_phi[:, 3])
    m_lv = _pair_mass(l_pt, l_eta, l_phi, m_pt, zero, m_phi)
    m_jl = _pair_mass(j_pt[:, 0], j_eta[:, 0], j_phi[:, 0], l_pt, l_eta, l_phi)
    m_jjj = np.sqrt(m_jj ** 2 + _pair_mass(j_pt[:, 2], j_eta[:, 2], j_phi[:, 2], j_pt[:, 0], j_eta[:, 0], j_phi[:, 0]) ** 2)
    m_wbb = np.sqrt(m_lv ** 2 + m_bb ** 2)
    m_wwbb = np.sqrt(m_jj ** 2 + m_lv ** 2 + m_bb ** 2)
    # Log-odds: resonance bumps in the derived masses, a b-tag x b-tag interaction,
    # a transverse-momentum threshold and an angular term only visible from two raw
    # columns together, so shallow trees and additive models both fall short.
    logit = 0.8 * (
        -0.55 * ((np.log(m_bb) - 0.15) / 0.35) ** 2
        - 0.35 * ((np.log(m_jj) - 0.05) / 0.45) ** 2
        + 1.2 * (btag[:, 2] > 0) * (btag[:, 3] > 0)
        + 0.7 * btag[:, 0] * (j_pt[:, 0] > 1.2)
        + 1.0 * np.cos(l_phi - m_phi) * (m_pt > 0.9)
        + 0.6 * np.tanh(2.0 * (m_lv - 1.0))
        - 0.3 * np.abs(j_eta[:, 0] - j_eta[:, 1])
        + 2.5
    )
    p = 1.0 / (1.0 + np.exp(-logit))
    y = (rng.uniform(size=n) < p).astype(np.float64)
    X = np.column_stack([
        l_pt, l_eta, l_phi, m_pt, m_phi,
        j_pt[:, 0], j_eta[:, 0], j_phi[:, 0], btag[:, 0],
        j_pt[:, 1], j_eta[:, 1], j_phi[:, 1], btag[:, 1],
        j_pt[:, 2], j_eta[:, 2], j_phi[:, 2], btag[:, 2],
        j_pt[:, 3], j_eta[:, 3], j_phi[:, 3], btag[:, 3],
        m_jj, m_jjj, m_lv, m_jl, m_bb, m_wbb, m_wwbb,
    ])
    return X, y, p


def _generate_higgs(n, seed, key0):
    X = np.empty((n, HIGGS_N_FEATURES), dtype=np.float64)
    y = np.empty(n, dtype=np.float64)
    p = np.empty(n, dtype=np.float64)
    for c, start in enumerate(range(0, n, CHUNK)):
        stop = min(n, start + CHUNK)
        # The full chunk is always drawn, so a prefix of rows never depends on n.
        Xc, yc, pc = _higgs_chunk(_chunk_rng(seed, key0 + c), CHUNK)
        X[start:stop], y[start:stop], p[start:stop] = Xc[:stop - start], yc[:stop - start], pc[:stop - start]
    return X, y, p


def higgs_paths(n_train, seed=0, n_test=HIGGS_TEST_ROWS, out_dir=OUT_DIR):
    """Cache file paths of :func:`higgs_like`.

    Returns
    -------
    dict
        Keys ``X_train, y_train, X_test, y_test, p_test`` -> ``.npy`` paths.
    """
    tag = f"higgs_s{seed}"
    return {
        "X_train": os.path.join(out_dir, f"{tag}_train{n_train}_X.npy"),
        "y_train": os.path.join(out_dir, f"{tag}_train{n_train}_y.npy"),
        "X_test": os.path.join(out_dir, f"{tag}_test{n_test}_X.npy"),
        "y_test": os.path.join(out_dir, f"{tag}_test{n_test}_y.npy"),
        "p_test": os.path.join(out_dir, f"{tag}_test{n_test}_p.npy"),
    }


def higgs_like(n_train=1_000_000, seed=0, n_test=HIGGS_TEST_ROWS, out_dir=OUT_DIR):
    """Generate (once) and cache the HIGGS-like binary classification set.

    Parameters
    ----------
    n_train : int
        Training rows; the first ``n`` rows of any larger ``n_train`` are the same.
    seed : int
    n_test : int
    out_dir : str

    Returns
    -------
    dict
        Same keys as :func:`higgs_paths`, the ``.npy`` paths (all exist on return).
        Shapes: ``X_*`` (n, 28) float64 C-order; ``y_*`` (n,) float64 in {0, 1};
        ``p_test`` (n_test,) the true probabilities.
    """
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be positive, got {n_train}, {n_test}")
    paths = higgs_paths(n_train, seed, n_test, out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if not (os.path.exists(paths["X_train"]) and os.path.exists(paths["y_train"])):
        X, y, _ = _generate_higgs(n_train, seed, 0)
        _save(paths["X_train"], X)
        _save(paths["y_train"], y)
        del X, y
    if not all(os.path.exists(paths[k]) for k in ("X_test", "y_test", "p_test")):
        X, y, p = _generate_higgs(n_test, seed, _TEST_STREAM)
        _save(paths["X_test"], X)
        _save(paths["y_test"], y)
        _save(paths["p_test"], p)
    return paths


def _save(path, arr):
    # Write to a temporary name first: two processes asking for the same file at once
    # must never read a half-written array.
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    np.save(tmp, np.ascontiguousarray(arr))
    os.replace(tmp, path)


def load_rows(path, rank=0, size=1):
    """This rank's contiguous block of rows of a cached ``.npy``, read into memory.

    The block is read from the file straight into a fresh array. (Copying it out of
    an ``mmap`` would keep the mapped file pages resident during the copy, so every
    contender's peak RSS would count the block twice; with 1M x 28 float64 that was
    224 MB of harness, not of the library measured.)

    Parameters
    ----------
    path : str
    rank, size : int
        Block ``rank`` of ``size`` near-equal blocks (sizes differ by at most one).

    Returns
    -------
    ndarray
        A private in-memory copy of the rows (shape ``(n_block, ...)``).
    """
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(fh)
        if fortran or dtype.hasobject:
            raise ValueError(f"{path}: expected a C-order numeric array")
        start, stop = block_bounds(shape[0], rank, size)
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        out = np.empty((stop - start,) + tuple(shape[1:]), dtype=dtype)
        fh.seek(fh.tell() + start * row_bytes)
        if fh.readinto(memoryview(out).cast("B")) != out.nbytes:
            raise ValueError(f"{path}: file shorter than its header says")
    return out


def block_bounds(n, rank, size):
    """``(start, stop)`` of block ``rank`` out of ``size`` over ``n`` rows."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


# --------------------------------------------------------------------------- Wager-Athey

def wa_sigma(z):
    """Wager-Athey's s(z) = 1 + 1 / (1 + exp(-20 (z - 1/3)))."""
    return 1.0 + 1.0 / (1.0 + np.exp(-20.0 * (z - 1.0 / 3.0)))


def wa_tau(X):
    """True effect tau(x) = 1 + s(x1) s(x2); shape (n,) from X of shape (n, d >= 2)."""
    return 1.0 + wa_sigma(X[:, 0]) * wa_sigma(X[:, 1])


def wa_main_effect(X):
    """Main effect m(x) = 2 x3 + sin(pi x4) - 1 - 2/pi (mean zero under U[0,1]).

    A non-constant m makes the design exercise local centering (a forest fitted on raw
    outcomes sees m's variation as noise); it uses columns 3 and 4, which do not enter
    tau, so a forest that splits on them wastes splits.
    """
    return 2.0 * X[:, 2] + np.sin(np.pi * X[:, 3]) - 1.0 - 2.0 / np.pi


def _wa_chunk(rng, n, d, noise):
    X = rng.uniform(size=(n, d))
    e = 0.5
    t = (rng.uniform(size=n) < e).astype(np.float64)
    tau = wa_tau(X)
    y = wa_main_effect(X) + (t - e) * tau + noise * rng.normal(size=n)
    return X, t, y, tau


def wager_athey(n, d=20, n_test=10_000, seed=0, noise=1.0, out_dir=OUT_DIR, cache=True):
    """The Wager-Athey heterogeneous-effect design with a main effect.

    ``X ~ U[0,1]^d``, ``e(x) = 0.5`` (binary treatment ``t ~ Bernoulli(0.5)``),
    ``tau(x) = 1 + s(x1) s(x2)`` with ``s(z) = 1 + 1/(1 + exp(-20 (z - 1/3)))``,
    ``y = m(x) + (t - e) tau(x) + noise * N(0, 1)`` with ``m`` from :func:`wa_main_effect`.
    (Wager & Athey 2018 use ``tau = s(x1) s(x2)`` and ``m = 0``; the constant shift of
    tau changes no error figure, the main effect makes the task less idealised.)

    Parameters
    ----------
    n : int
        Training rows (a prefix of any larger n with the same seed).
    d : int
        Number of features (at least 4).
    n_test : int
    seed : int
    noise : float
    out_dir : str
    cache : bool
        Keep an ``.npz`` under ``out_dir`` (worth it from 100k rows on).

    Returns
    -------
    dict
        ``X`` (n, d), ``t`` (n,), ``y`` (n,), ``tau`` (n,), ``X_test`` (n_test, d),
        ``tau_test`` (n_test,); all float64.
    """
    if d < 4:
        raise ValueError(f"the design needs d >= 4 features, got d={d}")
    if n < 1 or n_test < 1:
        raise ValueError(f"n and n_test must be positive, got {n}, {n_test}")
    path = os.path.join(out_dir, f"wa_s{seed}_d{d}_n{n}_t{n_test}_e{noise:g}.npz")
    if cache and os.path.exists(path):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    parts = {"X": [], "t": [], "y": [], "tau": []}
    for c, start in enumerate(range(0, n, CHUNK)):
        stop = min(n, start + CHUNK)
        chunk = _wa_chunk(_chunk_rng(seed, c), CHUNK, d, noise)
        for key, arr in zip(("X", "t", "y", "tau"), chunk):
            parts[key].append(arr[:stop - start])
    out = {k: np.concatenate(v) for k, v in parts.items()}
    X_test = _chunk_rng(seed, _TEST_STREAM).uniform(size=(n_test, d))
    out["X_test"] = X_test
    out["tau_test"] = wa_tau(X_test)
    if cache:
        os.makedirs(out_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, **out)
        os.replace(tmp, path)
    return out


# --------------------------------------------------------------------------- several treatments

def arm_tau(X, k):
    """Effect of arm ``k >= 1`` against arm 0: ``k/2 + s(x_k) s(x_{k+1})`` (columns k-1, k).

    Each arm's heterogeneity lives on its own pair of features, so a forest has to find
    different splits for different arms.
    """
    return 0.5 * k + wa_sigma(X[:, k - 1]) * wa_sigma(X[:, k])


def arm_tau_step(X, k):
    """Piecewise-constant effect of arm ``k >= 1`` against arm 0 (columns k-1, k, as :func:`arm_tau`).

    ``tau_k(x) = k/2 + 1.0 * 1[x_{k-1} > 0.5] - 0.8 * 1[x_k > 0.3]`` (0-based columns). Each
    arm has two jumps at thresholds a histogram forest must place exactly; the values are
    ``k/2 - 0.8``, ``k/2``, ``k/2 + 0.2`` and ``k/2 + 1``, so the arms' effects overlap.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        ``d >= k + 1``.
    k : int

    Returns
    -------
    ndarray of shape (n,)
    """
    return 0.5 * k + 1.0 * (X[:, k - 1] > 0.5) - 0.8 * (X[:, k] > 0.3)


#: Effect shapes of :func:`multi_arm_design`: name -> per-arm effect function ``f(X, k)``.
ARM_EFFECTS = {"smooth": arm_tau, "step": arm_tau_step}

#: Main-effect strengths of :func:`multi_arm_design`: multiples of :func:`wa_main_effect`
#: (sd about 0.65 at scale 1, so 3.3 when strong and 0.33 when weak, against noise sd 1).
MAIN_EFFECT_SCALES = {"strong": 5.0, "base": 1.0, "weak": 0.5}


def arm_probabilities(arms, balance="balanced"):
    """Assignment probabilities of :func:`multi_arm_design`.

    Parameters
    ----------
    arms : int
        At least 2.
    balance : {"balanced", "unbalanced"}
        ``"balanced"``: ``1/arms`` each. ``"unbalanced"``: the base arm 0 gets 10 %, the
        other arms share 90 % equally (3 arms: 10/45/45; 5 arms: 10/22.5/22.5/22.5/22.5).
        A rare base arm is the hard case: every effect is a contrast with arm 0.

    Returns
    -------
    ndarray of shape (arms,)
    """
    if arms < 2:
        raise ValueError(f"need at least 2 arms, got {arms}")
    if balance == "balanced":
        return np.full(arms, 1.0 / arms)
    if balance == "unbalanced":
        return np.array([0.1] + [0.9 / (arms - 1)] * (arms - 1))
    raise ValueError(f"balance must be 'balanced' or 'unbalanced', got {balance!r}")


def multi_arm_design(n, effect="smooth", main="base", arms=3, balance="balanced", d=20, n_test=10_000,
                     seed=0, noise=1.0):
    """One design of the several-arm family (issue 37): effect shape x main effect x arms x balance.

    ``X ~ U[0,1]^d``; arm ``t`` drawn independently of ``X`` with
    :func:`arm_probabilities` ``(arms, balance)``;
    ``y = c * m(x) + tau_t(x) + noise * N(0, 1)`` with ``tau_0 = 0``,
    ``m`` = :func:`wa_main_effect` (columns 2, 3) and

    * ``effect="smooth"``: ``tau_k = k/2 + s(x_{k-1}) s(x_k)`` (:func:`arm_tau`),
    * ``effect="step"``: ``tau_k = k/2 + 1[x_{k-1} > 0.5] - 0.8 * 1[x_k > 0.3]``
      (:func:`arm_tau_step`),

    (0-based columns; with 5 arms, arms 3 and 4 use columns 2-4, which ``m`` uses too), and
    ``c`` = 5 (``main="strong"``), 1 (``"base"``) or 0.5 (``"weak"``), or a float.
    ``effect="smooth", main="base", balance="balanced"`` is :func:`multi_arm`, bit for bit.

    All designs with the same ``seed`` and ``arms`` draw from one stream, so they share
    ``X``, ``X_test`` and, for the same ``balance``, ``t`` and the noise: differences
    between designs are the designs', not the draw's.

    Parameters
    ----------
    n : int
        Training rows.
    effect : {"smooth", "step"}
    main : {"strong", "base", "weak"} or float
    arms : int
        Levels ``0..arms-1`` (arm 0 the base); ``d >= max(arms, 4)``.
    balance : {"balanced", "unbalanced"}
    d : int
    n_test : int
    seed : int
    noise : float

    Returns
    -------
    dict
        ``X`` (n, d), ``t`` (n,) int64 in ``0..arms-1``, ``y`` (n,), ``X_test`` (n_test, d),
        ``tau_test`` (n_test, arms - 1): each arm's effect against arm 0.
    """
    if d < max(arms, 4):
        raise ValueError(f"the design needs d >= max(arms, 4), got d={d}, arms={arms}")
    if effect not in ARM_EFFECTS:
        raise ValueError(f"effect must be one of {sorted(ARM_EFFECTS)}, got {effect!r}")
    scale = MAIN_EFFECT_SCALES[main] if isinstance(main, str) else float(main)
    tau_fn = ARM_EFFECTS[effect]
    probs = arm_probabilities(arms, balance)
    rng = np.random.default_rng([seed, 31, arms])
    X = rng.uniform(size=(n, d))
    # Balanced designs keep multi_arm's draw (integers), so the base design is unchanged.
    t = rng.integers(0, arms, size=n) if balance == "balanced" else rng.choice(arms, size=n, p=probs)
    taus = np.column_stack([np.zeros(n)] + [tau_fn(X, k) for k in range(1, arms)])
    y = scale * wa_main_effect(X) + taus[np.arange(n), t] + noise * rng.normal(size=n)
    X_test = rng.uniform(size=(n_test, d))
    return {"X": X, "t": t, "y": y, "X_test": X_test,
            "tau_test": np.column_stack([tau_fn(X_test, k) for k in range(1, arms)])}


def parse_arm_design(name):
    """Keyword arguments of :func:`multi_arm_design` for a design name.

    Names: ``"arms3"``, ``"arms5"`` (:func:`multi_arm`: smooth, base main effect, balanced)
    or ``"{effect}-{main}-{arms}"`` with an optional ``"-unbal"`` suffix, e.g.
    ``"step-strong-3"``, ``"smooth-weak-5"``, ``"step-strong-3-unbal"``.

    Parameters
    ----------
    name : str

    Returns
    -------
    dict
        ``effect``, ``main``, ``arms``, ``balance``.
    """
    m = re.fullmatch(r"arms(\d+)", name)
    if m:
        return {"effect": "smooth", "main": "base", "arms": int(m.group(1)), "balance": "balanced"}
    m = re.fullmatch(r"(smooth|step)-(strong|base|weak)-(\d+)(-unbal)?", name)
    if not m or int(m.group(3)) < 2:
        raise ValueError(f"unknown several-arm design {name!r}: expected 'arms<K>' or "
                         "'{smooth|step}-{strong|base|weak}-<K>[-unbal]'")
    return {"effect": m.group(1), "main": m.group(2), "arms": int(m.group(3)),
            "balance": "unbalanced" if m.group(4) else "balanced"}


def describe_arm_design(name):
    """One line of the truth of a named design (for result tables)."""
    kw = parse_arm_design(name)
    probs = "/".join(f"{100 * p:.3g}" for p in arm_probabilities(kw["arms"], kw["balance"]))
    shape = ("k/2 + s(x_(k-1)) s(x_k)" if kw["effect"] == "smooth"
             else "k/2 + 1[x_(k-1) > 0.5] - 0.8 1[x_k > 0.3]")
    return (f"{kw['arms']} arms ({probs} %), tau_k = {shape}, "
            f"main effect {MAIN_EFFECT_SCALES[kw['main']]:g} m(x)")


def multi_arm(n, arms=3, d=20, n_test=10_000, seed=0, noise=1.0):
    """Categorical treatment with ``arms`` levels, uniform assignment, main effect of :func:`wa_main_effect`.

    ``y = m(x) + tau_t(x) + noise * N(0, 1)`` with ``tau_0 = 0`` and ``tau_k`` from
    :func:`arm_tau` (so ``d >= max(arms, 4)``); the ``"smooth"``, ``"base"``,
    ``"balanced"`` member of :func:`multi_arm_design`.

    Returns
    -------
    dict
        ``X`` (n, d), ``t`` (n,) int64 in ``0..arms-1``, ``y`` (n,), ``X_test`` (n_test, d),
        ``tau_test`` (n_test, arms - 1): each arm's effect against arm 0.
    """
    return multi_arm_design(n, effect="smooth", main="base", arms=arms, balance="balanced", d=d,
                            n_test=n_test, seed=seed, noise=noise)


def continuous_two(n, d=20, n_test=10_000, seed=0, noise=1.0):
    """Two continuous treatment columns, ``t_j = 0.3 x_{j+4} + N(0, 1)`` (confounded through x5, x6).

    ``y = m(x) + t_1 tau_1(x) + t_2 tau_2(x) + noise * N(0, 1)`` with ``tau_j`` from
    :func:`arm_tau` (``j = 1, 2``). ``tau_test`` has shape (n_test, 2).
    """
    rng = np.random.default_rng([seed, 37])
    X = rng.uniform(size=(n, d))
    T = 0.3 * X[:, 4:6] + rng.normal(size=(n, 2))
    taus = np.column_stack([arm_tau(X, 1), arm_tau(X, 2)])
    y = wa_main_effect(X) + np.sum(T * taus, axis=1) + noise * rng.normal(size=n)
    X_test = rng.uniform(size=(n_test, d))
    return {"X": X, "t": T, "y": y, "X_test": X_test,
            "tau_test": np.column_stack([arm_tau(X_test, 1), arm_tau(X_test, 2)])}


# --------------------------------------------------------------------------- dense interactions (issue 37)

INTERACTION_TEST_ROWS = 100_000


def _interaction_recipe(d, seed):
    """The fixed log-odds recipe of :func:`dense_interactions` for ``d`` features.

    Drawn from its own stream (keyed by ``seed`` and ``d``), so every chunk of every
    split uses the same function of ``x``.

    Returns
    -------
    dict
        ``main`` (d,) coefficient and ``shape`` (d,) int in 0..3 of each column's main
        effect; ``pairs`` (m, 2) int columns, ``pair_coef`` (m,), ``pair_kind`` (m,) int
        in {0, 1} (product or threshold-and) and ``pair_cut`` (m, 2) thresholds of the
        interactions; ``scale`` the factor that brings the log-odds to standard deviation 1.6.
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 37, int(d), 0]))
    n_inf = max(4, int(np.ceil(0.6 * d)))          # informative columns; the rest are noise
    main = np.zeros(d)
    main[:n_inf] = rng.uniform(0.3, 1.0, size=n_inf) * rng.choice([-1.0, 1.0], size=n_inf)
    main[:n_inf] *= 0.9 ** np.arange(n_inf) + 0.2   # a few strong columns, a long tail of weak ones
    shape = rng.integers(0, 4, size=d)
    m = max(3, d // 2)
    pairs = np.stack([rng.choice(min(d, n_inf), size=2, replace=False) for _ in range(m)])
    pair_coef = rng.uniform(0.4, 1.0, size=m) * rng.choice([-1.0, 1.0], size=m)
    pair_kind = rng.integers(0, 2, size=m)
    pair_cut = rng.uniform(-0.8, 0.8, size=(m, 2))
    recipe = dict(main=main, shape=shape, pairs=pairs, pair_coef=pair_coef, pair_kind=pair_kind,
                  pair_cut=pair_cut, scale=1.0)
    # Calibrate on a sample of the design itself: signal of the same strength at every d.
    Xc = _interaction_features(np.random.default_rng(np.random.SeedSequence([int(seed), 37, int(d), 1])),
                               20_000, d)
    recipe["scale"] = 1.6 / float(np.std(_interaction_logit(Xc, recipe)))
    return recipe


def _interaction_features(rng, n, d):
    """Columns of :func:`dense_interactions`, float64 (n, d), by ``j % 5``: normal,
    uniform, skewed (centred lognormal), correlated with the column before, and counts
    (Poisson, few distinct values, many ties), each scaled to about unit variance."""
    Z = rng.normal(size=(n, d))
    X = np.empty((n, d))
    for j in range(d):
        kind = j % 5
        if kind == 0:
            X[:, j] = Z[:, j]
        elif kind == 1:
            X[:, j] = (rng.uniform(size=n) - 0.5) * np.sqrt(12.0)
        elif kind == 2:
            X[:, j] = (np.exp(0.6 * Z[:, j]) - np.exp(0.18)) / 0.67
        elif kind == 3:
            X[:, j] = 0.7 * X[:, j - 1] + 0.71 * Z[:, j]
        else:
            X[:, j] = (rng.poisson(3.0, size=n) - 3.0) / np.sqrt(3.0)
    return X


def _interaction_logit(X, r):
    """Log-odds of :func:`dense_interactions` for rows ``X`` (n, d) under recipe ``r``; shape (n,)."""
    logit = np.zeros(X.shape[0])
    for j in np.flatnonzero(r["main"]):
        x = X[:, j]
        g = (x, np.tanh(2.0 * x), np.abs(x) - 0.8, (x > 0.3) - 0.4)[int(r["shape"][j])]
        logit += r["main"][j] * g
    for (a, b), c, kind, (ta, tb) in zip(r["pairs"], r["pair_coef"], r["pair_kind"], r["pair_cut"]):
        if kind == 0:
            logit += c * np.tanh(X[:, a]) * np.tanh(X[:, b])
        else:
            logit += 1.5 * c * (((X[:, a] > ta) & (X[:, b] > tb)) - 0.25)
    return r["scale"] * logit


def _generate_interactions(n, d, seed, key0, recipe):
    X = np.empty((n, d), dtype=np.float32)
    y = np.empty(n, dtype=np.float64)
    for c, start in enumerate(range(0, n, CHUNK)):
        stop = min(n, start + CHUNK)
        # The full chunk is always drawn, so a prefix of rows never depends on n.
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 37, int(d), 2, key0 + c]))
        Xc = _interaction_features(rng, CHUNK, d)
        p = 1.0 / (1.0 + np.exp(-_interaction_logit(Xc, recipe)))
        yc = (rng.uniform(size=CHUNK) < p).astype(np.float64)
        # Labels come from the float64 columns; the learners see them rounded to float32.
        X[start:stop], y[start:stop] = Xc[:stop - start], yc[:stop - start]
    return X, y


def dense_interactions(n, d=40, seed=0, n_test=INTERACTION_TEST_ROWS):
    """Dense float32 binary task with main effects and pairwise interactions (issue 37).

    ``d`` columns of five kinds (normal, uniform, skewed, correlated with the column
    before, Poisson counts with many ties). About 60 % of the columns carry a main
    effect (linear, tanh, V-shaped or a step, strengths decaying along the columns);
    ``max(3, d // 2)`` random pairs of them interact (a product of tanh's or an AND of
    two thresholds); the rest are noise. The log-odds are scaled to standard deviation
    1.6 at every ``d`` and ``y ~ Bernoulli(sigmoid(log-odds))``. Generated in memory
    (fast: no cache); the first ``n`` rows of any larger ``n`` are the same.

    Parameters
    ----------
    n : int
        Training rows.
    d : int
        Columns (>= 2).
    seed : int
    n_test : int
        Held-out rows (their own stream).

    Returns
    -------
    dict
        ``X`` (n, d) float32 C-order, ``y`` (n,) float64 in {0, 1}, ``X_test``
        (n_test, d) float32, ``y_test`` (n_test,).
    """
    if n < 1 or n_test < 1 or d < 2:
        raise ValueError(f"need n >= 1, n_test >= 1 and d >= 2, got n={n}, n_test={n_test}, d={d}")
    recipe = _interaction_recipe(d, seed)
    X, y = _generate_interactions(n, d, seed, 0, recipe)
    X_test, y_test = _generate_interactions(n_test, d, seed, _TEST_STREAM, recipe)
    return {"X": X, "y": y, "X_test": X_test, "y_test": y_test}


# --------------------------------------------------------------------------- IHDP

#: The 25 IHDP covariates of Hill (2011): 6 continuous, then 19 binary.
IHDP_CONTINUOUS = ("bw", "b.head", "preterm", "birth.o", "nnhealth", "momage")
IHDP_BINARY = ("sex", "twin", "b.marr", "mom.lths", "mom.hs", "mom.scoll", "cig", "first",
               "booze", "drugs", "work.dur", "prenatal", "site1", "site2", "site3", "site4",
               "site5", "site6", "site7")


def ihdp_csv_path():
    """Path of EconML's IHDP covariate file ``econml/data/ihdp/sim.csv``.

    Raises
    ------
    FileNotFoundError
        When EconML is not installed (run ``make bench-env``).
    """
    import importlib.util

    spec = importlib.util.find_spec("econml")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("econml is not installed; IHDP covariates come from its "
                                "data/ihdp/sim.csv (run `make bench-env`)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "ihdp", "sim.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"IHDP covariate file missing: {path}")
    return path


def ihdp_covariates(path=None):
    """IHDP covariates and treatment, Hill's (2011) subset.

    The randomised trial is made observational by dropping treated children of
    non-white mothers (Hill 2011), leaving 747 rows. Continuous columns are
    standardised.

    Returns
    -------
    X : ndarray of shape (747, 25), float64
    t : ndarray of shape (747,), float64 in {0, 1}
    """
    path = path or ihdp_csv_path()
    with open(path) as fh:
        header = fh.readline().strip().split(",")
    data = np.loadtxt(path, delimiter=",", skiprows=1)
    col = {name: i for i, name in enumerate(header)}
    missing = [c for c in ("treat", "momwhite") + IHDP_CONTINUOUS + IHDP_BINARY if c not in col]
    if missing:
        raise ValueError(f"{path} lacks IHDP columns {missing}")
    keep = ~((data[:, col["treat"]] == 1) & (data[:, col["momwhite"]] == 0))
    data = data[keep]
    X = data[:, [col[c] for c in IHDP_CONTINUOUS + IHDP_BINARY]].astype(np.float64)
    cont = slice(0, len(IHDP_CONTINUOUS))
    X[:, cont] = (X[:, cont] - X[:, cont].mean(axis=0)) / X[:, cont].std(axis=0)
    return X, data[:, col["treat"]].astype(np.float64)


def ihdp(replication, path=None):
    """One IHDP replication on Hill's (2011) response surface B.

    ``mu0(x) = exp((x + 0.5) beta)``, ``mu1(x) = x beta - omega``, with the entries of
    ``beta`` drawn from {0, .1, .2, .3, .4} with probabilities (.6, .1, .1, .1, .1) and
    ``omega`` set so the average effect on the treated is 4; the factual outcome is
    ``mu_t(x) + N(0, 1)``. Replication ``r`` draws ``beta`` and the noise from seed ``r``.

    Parameters
    ----------
    replication : int
        Non-negative replication index.
    path : str or None
        Covariate csv (default :func:`ihdp_csv_path`).

    Returns
    -------
    dict
        ``X`` (747, 25), ``t`` (747,), ``y`` (747,) factual outcome, ``y_cf`` (747,)
        counterfactual, ``mu0``, ``mu1`` (747,), ``tau`` = mu1 - mu0 (747,).
    """
    if replication < 0:
        raise ValueError(f"replication must be >= 0, got {replication}")
    X, t = ihdp_covariates(path)
    rng = np.random.default_rng(np.random.SeedSequence([20110101, int(replication)]))
    beta = rng.choice(np.array([0.0, 0.1, 0.2, 0.3, 0.4]), p=[0.6, 0.1, 0.1, 0.1, 0.1], size=X.shape[1])
    mu0 = np.exp((X + 0.5) @ beta)
    lin = X @ beta
    omega = np.mean(lin[t == 1] - mu0[t == 1]) - 4.0
    mu1 = lin - omega
    noise0, noise1 = rng.normal(size=(2, X.shape[0]))
    y0, y1 = mu0 + noise0, mu1 + noise1
    y = np.where(t == 1, y1, y0)
    y_cf = np.where(t == 1, y0, y1)
    return {"X": X, "t": t, "y": y, "y_cf": y_cf, "mu0": mu0, "mu1": mu1, "tau": mu1 - mu0}


def pehe(tau_hat, tau):
    """Precision in estimating heterogeneous effects: sqrt(mean((tau_hat - tau)^2))."""
    tau_hat = np.asarray(tau_hat, dtype=np.float64).ravel()
    tau = np.asarray(tau, dtype=np.float64).ravel()
    if tau_hat.shape != tau.shape:
        raise ValueError(f"tau_hat has shape {tau_hat.shape}, tau has {tau.shape}")
    return float(np.sqrt(np.mean((tau_hat - tau) ** 2)))
