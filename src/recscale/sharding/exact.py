"""Stage 12: a small plan still uneven, its options and ranks chosen again together (CP-SAT).

In: the ``PlanContext`` and the final ``Solution`` (not modified).
Out: ``exact`` -> a ``Solution`` with a lower maximum rank cost, or the same one.

The search before this stage changes one or two tables at a time; where pieces near a rank
each must tile the ranks, and memory decides which may share one, the even plans can lie several
changes away (the property tests' mix 23: every single change raised the slowest rank). Here,
where the plan is above ``BALANCE`` x its mean and at most ``CELLS`` (candidate piece, rank)
pairs, every sharded table's options (sharding type and split, in its plan's tier or any tier it
may take) whose costliest piece is below the plan's maximum and whose total the plan's maximum
still allows, and a rank for every piece, are chosen at once by OR-tools' CP-SAT solver: one
option per table, each piece on one rank, at most one piece of a table per rank, a host-bound
table's pieces on one host, every tier's bytes within its budget on every rank, minimising the
slowest rank. A slow tier's tables take the plan's cache fraction first and, where the plan is
still uneven, any the planner may choose (mix 134: one table's columns in DDR with half their
rows cached). The plan is the solver's hint; replicated tables stay as they are. Costs are
rounded up and budgets down, so what the solver accepts fits; the answer is rebuilt from the
cost model and kept only if its slowest rank is lower. Deterministic: an interleaved search
under a limit of deterministic time (counted work, not wall-clock), the same answer on any
machine.
"""

from __future__ import annotations

import numpy as np

from .context import PlanContext
from .cpsat import PlacementModel, cut, option_keys
from .descent import BALANCE
from .option_search import choice_of
from .shards import Solution, build_layout, summarize
from .tiering import cache_candidates

# (candidate piece, rank) pairs at most: above it the model takes longer to build than to gain
CELLS = 40_000
# the same before the options are cut into pieces and those the plan's maximum cannot carry left
# out (on the property mixes that leaves 55-95% of them)
PRE_CELLS = 4 * CELLS
# CP-SAT's deterministic time limit (its unit is about a second of one core's work here)
WORK = 20.0
# costs in 1/SCALE of the plan's maximum; bytes in 1/SCALE of a rank's budget
SCALE = 100_000


def exact(ctx: PlanContext, sol: Solution) -> Solution:
    """First with a slow tier's tables at the plan's cache fraction, then, where the plan is
    still uneven, at any the planner may choose (a larger model: where the first finds a plan it
    is found sooner)."""
    unsolved = None
    for caches in ((sol.cache_fraction,), cache_candidates(ctx.opts)):
        sol, unsolved = _once(ctx, sol, caches, unsolved)
    return sol


def _once(ctx: PlanContext, sol: Solution, caches, unsolved=None):
    """-> (the plan, ``unsolved``: ``(sol, candidates)`` where the solver found nothing below
    ``sol``'s maximum from those candidates, else None). Given an earlier call's ``unsolved``
    and the same model to hand the solver (the same plan as its hint, the same candidates: no
    table gains an option in a slow tier at the other caches), the answer would be the same
    (the solver is deterministic), so it is not asked again: on plans with nothing to spill,
    half the stage's time."""
    lay = sol.layout
    W, ct = ctx.W, ctx.ct
    top = float(sol.load.max())
    if W < 2 or not lay.groups or top <= BALANCE * float(sol.load.mean()):
        return sol, None
    fixed = float(sol.dp_compute.sum() + sol.dp_comms.sum())  # replicated: on every rank
    budget = ctx.budget - sol.dp_need.sum(axis=0)
    choice = choice_of(ctx, sol)
    # each sharded table's (option, tier, cache) in the plan
    current = {tab: (int(choice[tab]), int(lay.tier[s]), float(lay.cache[s]))
               for tab, s, _ in lay.groups}
    cands = _candidates(ctx, current, top, caches)
    if cands is None:
        return sol, None
    cheapest = {}
    for tab, _, cost, _, _ in cands:
        cheapest[tab] = min(cheapest.get(tab, np.inf), float(cost.sum()))
    room = W * (top - fixed) - sum(cheapest.values())
    cands = [c for c in cands if float(c[2].sum()) - cheapest[c[0]] <= room * (1 + 1e-9)
             or c[1] == current[c[0]]]
    if sum(c[2].size for c in cands) * W > CELLS:
        return sol, None
    asked = [(c[0], c[1]) for c in cands]
    if unsolved is not None and unsolved[0] is sol and unsolved[1] == asked:
        return sol, unsolved
    got = _solve(ctx, cands, current, sol, top, fixed, budget)
    if got is None:
        return sol, (sol, asked)
    ch = np.where(choice == ctx.dp_col, ctx.dp_col, 0)
    tier = np.full(ctx.n, ct)
    cache = np.zeros(ctx.n)
    for tab, ((j, t, c), _) in got.items():
        ch[tab], tier[tab], cache[tab] = j, t, c
    new = build_layout(ctx, ch, tier, cache)
    for tab, s, e in new.groups:
        new.rank[s:e] = got[tab][1]
    free = np.repeat(budget[:, None], W, axis=1)
    np.add.at(free.T, new.rank, -new.need)
    if (free < -1e-6 * np.maximum(ctx.budget[:, None], 1.0)).any():
        return sol, None  # rounding let it through: keep the plan
    occ = np.zeros((ctx.n, W), dtype=np.int32)
    np.add.at(occ, (new.table, new.rank), 1)
    # the plan's cache fraction: its own while a slow-tier table keeps it, else the largest taken
    spilled = {key[2] for key, _ in got.values() if key[1] != ct}
    cf = sol.cache_fraction if not spilled or sol.cache_fraction in spilled else max(spilled)
    out = summarize(ctx, new, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                    sol.dp_storage, cf, free, occ)
    # a lower slowest rank only: the same maximum at a higher mean is more work for no faster step
    if float(out.load.max()) < top * (1 - 1e-9):
        return out, None
    return sol, (sol, asked)


def _candidates(ctx: PlanContext, current: dict, top: float, caches):
    """(table, (option, tier, cache), piece costs, piece bytes (pieces, 3), host-bound) for
    every sharded table's options, in any tier it may take (a slow tier with any of
    ``caches``), that one rank can hold, no piece above ``top`` (the plan's own, ``current``,
    always)."""
    keys = {tab: {own} for tab, own in current.items()}
    found = option_keys(ctx, np.array(sorted(current), dtype=np.int64), caches, top, PRE_CELLS)
    if found is None:  # far too many to cut and cost them all
        return None
    for tab, *key in found:
        keys[tab].add(tuple(key))
    out = []
    for tab, own in current.items():
        for key in sorted(keys[tab]):
            cost, need, bound = cut(ctx, tab, key)
            if key != own and (cost.max() >= top or (need > ctx.budget[None, :]).any()):
                continue
            out.append((tab, key, cost, need, bound))
    return out or None


def _solve(ctx: PlanContext, cands, current, sol: Solution, top: float, fixed: float,
           budget: np.ndarray):
    """The solver's choice: {table: ((option, tier, cache), its pieces' ranks)}, or None where
    it found nothing below ``top``."""
    W = ctx.W
    lay = sol.layout
    unit = np.where(budget > 0, budget, 1.0) / SCALE
    model = PlacementModel(W, ctx.Lw, np.floor(budget / unit).astype(np.int64))
    hint = {}
    for tab, s, e in lay.groups:
        hint[tab] = (current[tab], lay.rank[s:e])
    x = []
    for ci, (tab, key, cost, need, bound) in enumerate(cands):
        c = np.ceil(cost / top * SCALE).astype(np.int64)
        nb = np.ceil(need / unit[None, :]).astype(np.int64)
        own = hint[tab][0] == key
        ranks = hint[tab][1].copy()
        if own:  # identical pieces ascending, as the model orders them
            p = 0
            while p < cost.size:
                q = p + 1
                while q < cost.size and c[q] == c[p] and (nb[q] == nb[p]).all():
                    q += 1
                ranks[p:q] = np.sort(ranks[p:q])
                p = q
        x.append(model.option(tab, c, nb, bound, f"y{ci}", (own, ranks)))
    status = model.solve(WORK, SCALE * 4, int(np.ceil(fixed / top * SCALE)))
    if not model.found(status):
        return None
    value = model.solver.Value
    out = {}
    for ci, (tab, key, cost, _, _) in enumerate(cands):
        y, rows = x[ci]
        if value(y):
            ranks = np.array([next(r for r in range(W) if value(rows[p][r]))
                              for p in range(cost.size)], dtype=np.int64)
            out[tab] = (key, ranks)
    return out
