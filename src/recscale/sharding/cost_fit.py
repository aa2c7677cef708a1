"""Fits of the machine's measured times (``recscale.measure``) to the cost model's constants
(numpy and scipy only): non-negative least squares on relative error, one function per part
measured. The bytes a lookup moves are the cost model's own (``cost.lookup_bytes``), so a fitted
bandwidth means what the planner charges per byte."""

from __future__ import annotations

import numpy as np

from .cost import lookup_bytes


def nnls(X: np.ndarray, y: np.ndarray, scale: np.ndarray | None = None,
         weight: np.ndarray | None = None) -> np.ndarray:
    """Non-negative coefficients minimising the *relative* error (rows weighted by 1 / y, or by
    1 / ``scale``: a residual's relative error is against the whole time it came from), so small
    messages and batches count as much as large ones; ``weight``: rows that count more."""
    from scipy.optimize import nnls as scipy_nnls

    w = 1.0 / np.maximum(y if scale is None else scale, 1e-9)
    if weight is not None:
        w = w * weight
    Xw, yw = X * w[:, None], y * w
    s = np.maximum(np.abs(Xw).max(axis=0), 1e-30)  # comparable column magnitudes
    coef, _ = scipy_nnls(Xw / s, yw)
    return coef / s


def rel_err(X, y, coef) -> float:
    pred = X @ coef
    return float(np.median(np.abs(pred - y) / np.maximum(y, 1e-12)))


def point_bytes(p: dict, wb: float, opt_row: float, opt_elem: float, ids=None, bags=None):
    """A measured point's bytes (``cost.lookup_bytes``): its ``ids`` (default ``p["ids"]``) of
    which ``p["distinct"]`` distinct (all where not counted), its ``bags`` pooled vectors at
    ``p["dim"]`` -> (tier bytes, compute-tier bytes)."""
    ids = p["ids"] if ids is None else ids
    bags = p["bags"] if bags is None else bags
    distinct = p.get("distinct", ids)
    return lookup_bytes(ids, distinct / ids if ids else 1.0, bags, p["dim"], wb, opt_row, opt_elem)


def fit_memory(pts, wb, opt_row, opt_elem):
    """Seconds = fixed + per id + per pooled vector + per distinct row updated + the cost
    model's bytes / bandwidth. The distinct rows' own term is what fbgemm's fused backward
    spends per row it updates (sorting the ids, finding the unique rows, the row's update): a
    fit without it missed by 25-28% in the median on two 2-vCPU VMs, uniform ids
    1.3-2.5x slower than fitted and power-law ids faster."""
    X, y = [], []
    for p in pts:
        d = p.get("distinct", p["ids"])
        tb, pb = point_bytes(p, wb, opt_row, opt_elem)
        X.append([1.0, p["ids"], p["bags"], tb + pb, d])
        y.append(p["seconds"])
    X, y = np.array(X), np.array(y)
    c = nnls(X, y)
    bw = 1.0 / c[3] if c[3] > 0 else 1e12
    return {"op_s": c[0], "id_s": c[1], "bag_s": c[2], "bw": bw, "row_s": c[4],
            "fit_rel_err": rel_err(X, y, c)}


def fit_cached(pts, fast, wb, opt_row, opt_elem):
    """The slow tier behind a cache: what the hits cost is the compute tier's (``fast``); the
    misses' share of ids and bytes is fitted."""
    X, y = [], []
    for p in pts:
        tb, pb = point_bytes(p, wb, opt_row, opt_elem)
        h, d = p["hit_rate"], p.get("distinct", p["ids"])
        known = (p["ids"] * h * fast["id_s"] + p["bags"] * fast["bag_s"]
                 + (tb * h + pb) / fast["bw"] + d * h * fast["row_s"])
        X.append([1.0, p["ids"] * (1 - h), tb * (1 - h), d * (1 - h)])
        y.append(max(p["seconds"] - known, 0.0))
    X, y = np.array(X), np.array(y)
    total = np.array([p["seconds"] for p in pts])
    c = nnls(X, y, total)
    bw = 1.0 / c[2] if c[2] > 0 else 1e12
    return {"op_s": c[0], "id_s": c[1], "bw": bw, "row_s": c[3],
            "fit_rel_err": float(np.median(np.abs(X @ c - y) / total)),
            "hit_rate": float(np.mean([p["hit_rate"] for p in pts]))}


RUN_BATCH_WEIGHT = 4.0


def fit_dense(pts, run_batch: int | None = None):
    """Seconds = fixed + MLP FLOPs / rate + interaction elements x seconds each, the points at
    the run's batch (``run_batch``, default the largest) counting ``RUN_BATCH_WEIGHT`` times:
    the step is not linear in the batch (at dim 128 the activations of a batch of 1,024 leave
    the cache), and an even fit over 256, 640 and 1,024 samples came out 11-12% under the
    run's own batch in every calibration on a 2-vCPU VM, where training runs."""
    run_batch = max(p["batch"] for p in pts) if run_batch is None else run_batch
    X = np.array([[1.0, p["flops"], p.get("interaction", 0.0)] for p in pts])
    y = np.array([p["seconds"] for p in pts])
    c = nnls(X, y, weight=np.array([RUN_BATCH_WEIGHT if p["batch"] == run_batch else 1.0
                                    for p in pts]))
    return {"op_s": c[0], "flops": 1.0 / c[1] if c[1] > 0 else 1e15, "interaction_s": c[2],
            "fit_rel_err": rel_err(X, y, c)}


def fit_assembly(pts):
    """Seconds = fixed + output elements x seconds each (the fixed part is the collection's,
    counted in the exchange's)."""
    X = np.array([[1.0, p["elements"]] for p in pts])
    y = np.array([p["seconds"] for p in pts])
    c = nnls(X, y)
    return {"op_s": c[0], "s": c[1], "fit_rel_err": rel_err(X, y, c)}


def fit_comms(pts, W):
    X, y = [], []
    for p in pts:
        share = (W - 1) / W * (2 if p["collective"] == "all_reduce" else 1)
        X.append([1.0, p["bytes"] * share])
        y.append(p["seconds"])
    X, y = np.array(X), np.array(y)
    c = nnls(X, y)
    return {"lat_s": c[0], "bw": 1.0 / c[1] if c[1] > 0 else 1e12, "fit_rel_err": rel_err(X, y, c)}


def _lookups_and_assembly(p, T, wb, opt_row, opt_elem, fast, assemble_s):
    """Seconds of an exchange point's own lookups (``fast``: the in-memory fit's ``op_s``,
    ``id_s``, ``bag_s``, ``bw``, ``row_s``) and of its output's assembly: what its step holds beyond the
    exchange's work."""
    ids = bags = T * p["batch"]
    tb, pb = point_bytes(p, wb, opt_row, opt_elem, ids, bags)
    return (fast["op_s"] + ids * fast["id_s"] + bags * fast["bag_s"] + (tb + pb) / fast["bw"]
            + p.get("distinct", ids) * fast["row_s"] + p["batch"] * T * p["dim"] * assemble_s)


def fit_exchange(pts, fast, wb, opt_row, opt_elem, T, assemble_s=0.0):
    """The exchange's communication per step (as ``CommStats`` counts it) = calls x latency +
    bytes sent / bandwidth; the rest of its step beyond the lookups (``fast``: the in-memory
    fit) and the output's assembly (``assemble_s`` per element, its own term) = a fixed cost +
    bytes sent / ``exchange_bw``."""
    X = np.array([[p["calls"], p["bytes"]] for p in pts])
    y = np.array([p["comm_seconds"] for p in pts])
    c = nnls(X, y)
    fp32 = [p for p in pts if p.get("precision", "fp32") == "fp32"]
    Xc, yc = [], []
    residual = {}
    for p in pts:
        own = _lookups_and_assembly(p, T, wb, opt_row, opt_elem, fast, assemble_s)
        r = max(p["seconds"] - p["comm_seconds"] - own, 0.0)
        residual[(p["dim"], p.get("precision", "fp32"))] = r
        if p in fp32:
            Xc.append([1.0, p["bytes"]])
            yc.append(r)
    Xc, yc = np.array(Xc), np.array(yc)
    cc = nnls(Xc, yc, np.array([p["seconds"] for p in fp32]))
    # fp16 at the widest dim: its extra work beyond fp32's (with half the bytes to move) is the
    # codecs', per element encoded or decoded: every rank encodes all it sends (its own
    # samples' block too) and decodes all it receives, forward and backward: 4 x B x T x dim
    d = max(p["dim"] for p in pts)
    codec_s = 0.0
    if (d, "fp32") in residual and (d, "fp16") in residual:
        half = next(p for p in pts if p["dim"] == d and p.get("precision") == "fp16")
        extra = residual[(d, "fp16")] - (cc[0] + half["bytes"] * cc[1])
        codec_s = max(extra, 0.0) / (4 * half["batch"] * T * d)
    return {"lat_s": c[0], "bw": 1.0 / c[1] if c[1] > 0 else 1e12,
            "calls_per_step": float(np.mean([p["calls"] for p in pts])),
            "fit_rel_err": rel_err(X, y, c), "op_s": cc[0],
            "cpu_bw": 1.0 / cc[1] if cc[1] > 0 else 1e12, "codec_s": codec_s}


def _beyond(p, burst: float) -> float:
    """Bytes per step of an exchange point that its calls send beyond ``burst`` each."""
    return sum(calls * max(per_call - burst, 0.0) for calls, per_call in p["by_call"].values())


def fit_link(pts) -> dict[str, float]:
    """The exchange across hosts (``_measure_exchange`` points, the step pausing between calls)
    fitted to latency per call + the bytes each call sends beyond a burst at a rate: the token
    bucket that rate limiters (a NIC's or cloud network's, or tc's tbf) put on a link lets a
    call's first bytes through at once when the bucket refilled while the step computed. The
    burst is a grid value (4 KiB x sqrt(2)^k up to the largest call): the smallest within 10% of
    the least relative error, and only where a fit without a burst misses by more than 15% and
    the burst halves that (on a shared machine a noisy link without a bucket can fit a spurious
    burst slightly better: seen on a veth link, 2 MB with a 3.5 ms latency per call; a tbf link's
    fit without one missed by 38%); else 0 ->
    ``{"lat_s", "bw", "burst_bytes", "fit_rel_err"}``."""
    y = np.array([p["comm_seconds"] for p in pts])
    largest = max(per_call for p in pts for _, per_call in p["by_call"].values())
    grid = [0.0]
    while grid[-1] < largest:
        grid.append(4096.0 if grid[-1] == 0 else grid[-1] * 2 ** 0.5)
    fits = []
    for burst in grid:
        X = np.array([[p["calls"], _beyond(p, burst)] for p in pts])
        if not X[:, 1].any():  # no byte beyond the burst: the rate would be unknown
            break
        c = nnls(X, y)
        fits.append((rel_err(X, y, c), burst, c))
    best = min(f[0] for f in fits[1:]) if len(fits) > 1 else fits[0][0]
    if best < 0.5 * fits[0][0] and fits[0][0] > 0.15:
        err, burst, c = next(f for f in fits[1:] if f[0] <= 1.1 * best + 1e-3)
    else:
        err, burst, c = fits[0]
    return {"lat_s": float(c[0]), "bw": 1.0 / c[1] if c[1] > 0 else 1e12,
            "burst_bytes": float(burst), "fit_rel_err": err}


def fit_link_rate(pts) -> dict[str, float]:
    """Training steps across hosts (``recscale.measure.steps.measure_link_steps`` points: their
    measured communication ``comm``, and ``comm_by_rate``, the communication predicted with the
    link's rate x each of ``rate_factors``) -> the factor whose prediction is nearest to what
    the steps counted (the median error relative to each point's step; of factors within half a
    percent of the best, the one nearest 1): ``{"factor", "index", "fit_rel_err",
    "rel_err_at_1"}``."""
    return _nearest_factor(pts, "comm_by_rate", "comm")


def fit_exchange_work(pts) -> dict[str, float]:
    """Training steps on one host (``recscale.measure.steps.predict_host_steps`` points: the step
    measured, ``seconds``, and ``predicted_by_rate``, the step predicted with the exchange's work
    per byte, ``exchange_bw``, x each of ``rate_factors``) -> the factor whose predicted step is
    nearest to the measured one, as ``fit_link_rate`` picks it."""
    return _nearest_factor(pts, "predicted_by_rate", "seconds")


def _nearest_factor(pts, by_rate: str, measured: str) -> dict[str, float]:
    """The factor of ``rate_factors`` whose prediction ``by_rate`` is nearest to ``measured``
    (the median error relative to each point's step; of factors within half a percent of the
    best, the one nearest 1)."""
    factors = np.array(pts[0]["rate_factors"], dtype=float)
    err = np.array([np.median([abs(p[by_rate][i] - p[measured]) / max(p["seconds"], 1e-12)
                               for p in pts]) for i in range(len(factors))])
    near = np.flatnonzero(err <= err.min() + 0.005)
    i = int(near[np.argmin(np.abs(np.log(factors[near])))])
    one = int(np.argmin(np.abs(np.log(factors))))
    return {"factor": float(factors[i]), "index": i, "fit_rel_err": float(err[i]),
            "rel_err_at_1": float(err[one])}


def fit_link_steps(pts) -> dict[str, float]:
    """Training steps across hosts (``recscale.measure.steps.measure_link_steps`` points: the step
    measured, the step predicted on the host's calibration with the link and no CPU cost for
    it, the bytes a rank sent across) -> the link's extra work on the ranks' own cores, per step
    and per byte sent across: ``{"cpu_s", "cpu_bw", "fit_rel_err"}`` (0: none), the
    non-negative fit of measured - predicted, each point's error relative to its step."""
    X = np.array([[1.0, p["bytes_across"]] for p in pts])
    y = np.array([p["seconds"] - p["predicted"] for p in pts])
    whole = np.array([p["seconds"] for p in pts])
    c = nnls(X, y, whole)
    return {"cpu_s": float(c[0]), "cpu_bw": 1.0 / c[1] if c[1] > 0 else 0.0,
            "fit_rel_err": float(np.median(np.abs(X @ c - y) / whole))}
