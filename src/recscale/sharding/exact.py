"""Stage 12: a small plan still uneven, its options and ranks chosen again together (CP-SAT).

In: the ``PlanContext`` and the final ``Solution`` (not modified).
Out: ``exact`` -> a ``Solution`` with a lower maximum rank cost, or the same one.

The search before this stage changes one or two tables at a time; where pieces near a rank
each must tile the ranks, and memory decides which may share one, the even plans can lie several
changes away (the property tests' mix 23: every single change raised the slowest rank). Here, where the plan is above ``BALANCE`` x its mean
and at most ``CELLS`` (candidate piece, rank) pairs, every sharded table's options (sharding type
and split, in its plan's tier or any tier it may take, a slow tier with the plan's cache
fraction) whose costliest piece is below the plan's maximum and whose total the plan's maximum
still allows, and a rank for every piece, are chosen at once by OR-tools' CP-SAT solver: one
option per table, each piece on one rank, at most one piece of a table per rank, a host-bound
table's pieces on one host, every tier's bytes within its budget on every rank, minimising the
slowest rank. The plan is the solver's hint; replicated tables stay as they are. Costs are
rounded up and budgets down, so what the solver accepts fits; the answer is rebuilt from the
cost model and kept only if its slowest rank is lower. Deterministic: an interleaved search
under a limit of deterministic time (counted work, not wall-clock), the same answer on any
machine.
"""

from __future__ import annotations

import numpy as np

from .context import PlanContext
from .descent import BALANCE
from .option_search import choice_of
from .shards import Solution, build_layout, summarize

# (candidate piece, rank) pairs at most: above it the model takes longer to build than to gain
CELLS = 40_000
# CP-SAT's deterministic time limit (its unit is about a second of one core's work here)
WORK = 20.0
# costs in 1/SCALE of the plan's maximum; bytes in 1/SCALE of a rank's budget
SCALE = 100_000


def exact(ctx: PlanContext, sol: Solution) -> Solution:
    lay = sol.layout
    W, ct = ctx.W, ctx.ct
    top = float(sol.load.max())
    if W < 2 or not lay.groups or top <= BALANCE * float(sol.load.mean()):
        return sol
    fixed = float(sol.dp_compute.sum() + sol.dp_comms.sum())  # replicated: on every rank
    budget = ctx.budget - sol.dp_need.sum(axis=0)
    choice = choice_of(ctx, sol)
    # each sharded table's (option, tier, cache) in the plan
    current = {tab: (int(choice[tab]), int(lay.tier[s]), float(lay.cache[s]))
               for tab, s, _ in lay.groups}
    cands = _candidates(ctx, sol, current, top)
    if cands is None:
        return sol
    cheapest = {}
    for tab, _, cost, _, _ in cands:
        cheapest[tab] = min(cheapest.get(tab, np.inf), float(cost.sum()))
    room = W * (top - fixed) - sum(cheapest.values())
    cands = [c for c in cands if float(c[2].sum()) - cheapest[c[0]] <= room * (1 + 1e-9)
             or c[1] == current[c[0]]]
    if sum(c[2].size for c in cands) * W > CELLS:
        return sol
    got = _solve(ctx, cands, current, sol, top, fixed, budget)
    if got is None:
        return sol
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
        return sol  # rounding let it through: keep the plan
    occ = np.zeros((ctx.n, W), dtype=np.int32)
    np.add.at(occ, (new.table, new.rank), 1)
    out = summarize(ctx, new, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                    sol.dp_storage, sol.cache_fraction, free, occ)
    # a lower slowest rank only: the same maximum at a higher mean is more work for no faster step
    return out if float(out.load.max()) < top * (1 - 1e-9) else sol


def _candidates(ctx: PlanContext, sol: Solution, current: dict, top: float):
    """(table, (option, tier, cache), piece costs, piece bytes (pieces, 3), host-bound) for
    every sharded table's options that one rank can hold, no piece above ``top`` (the plan's
    own, ``current``, always)."""
    g, t = ctx.grid, ctx.tables
    out = []
    for tab, own in current.items():
        tiers = [int(t.pinned[tab])] if t.pinned[tab] >= 0 else list(ctx.avail)
        keys = {own}
        for j in np.flatnonzero(g.valid[tab]):
            if j == ctx.dp_col or g.n_shards[tab, j] > ctx.W:
                continue
            for ti in tiers:
                keys.add((int(j), ti, 0.0 if ti == ctx.ct else float(sol.cache_fraction)))
        for key in sorted(keys):
            one = np.full(ctx.n, ctx.dp_col, dtype=np.int64)
            one[tab] = key[0]
            part = build_layout(ctx, one, np.full(ctx.n, key[1]), np.full(ctx.n, key[2]))
            cost, need = part.cost, part.need
            if key != own and (cost.max() >= top or (need > ctx.budget[None, :]).any()):
                continue
            out.append((tab, key, cost, need, bool(part.host_bound[0])))
    return out or None


def _solve(ctx: PlanContext, cands, current, sol: Solution, top: float, fixed: float,
           budget: np.ndarray):
    """The solver's choice: {table: ((option, tier, cache), its pieces' ranks)}, or None where
    it found nothing below ``top``."""
    from ortools.sat.python import cp_model

    W, Lw = ctx.W, ctx.Lw
    H = W // Lw
    lay = sol.layout
    md = cp_model.CpModel()
    unit = np.where(budget > 0, budget, 1.0) / SCALE
    cap = np.floor(budget / unit).astype(np.int64)
    y, x, totals = [], [], []
    per_rank_cost = [[] for _ in range(W)]
    per_rank_mem = [[[] for _ in range(W)] for _ in range(3)]
    per_table_rank: dict = {}
    hint = {}
    for tab, s, e in lay.groups:
        hint[tab] = (current[tab], lay.rank[s:e])
    for ci, (tab, key, cost, need, bound) in enumerate(cands):
        yv = md.NewBoolVar(f"y{ci}")
        y.append(yv)
        c = np.ceil(cost / top * SCALE).astype(np.int64)
        totals.append(int(c.sum()))
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
        md.AddHint(yv, own)
        xs = []
        hosts = [md.NewBoolVar("") for _ in range(H)] if bound and H > 1 else None
        if hosts is not None:
            md.Add(sum(hosts) == yv)
        for p in range(cost.size):
            row = [md.NewBoolVar("") for _ in range(W)]
            md.Add(sum(row) == yv)
            for r, v in enumerate(row):
                per_rank_cost[r].append((int(c[p]), v))
                for t in range(3):
                    if nb[p, t] > 0:
                        per_rank_mem[t][r].append((int(nb[p, t]), v))
                per_table_rank.setdefault((tab, r), []).append(v)
                if hosts is not None:
                    md.AddImplication(v, hosts[r // Lw])
                md.AddHint(v, bool(own and ranks[p] == r))
            xs.append(row)
        # identical pieces are interchangeable: their ranks ascending (one of each such set)
        for p in range(cost.size - 1):
            if c[p] == c[p + 1] and (nb[p] == nb[p + 1]).all():
                md.Add(sum(r * v for r, v in enumerate(xs[p]))
                       < sum(r * v for r, v in enumerate(xs[p + 1]))).OnlyEnforceIf(yv)
        x.append(xs)
    for vs in per_table_rank.values():
        md.Add(sum(vs) <= 1)
    for tab in sorted({c[0] for c in cands}):
        md.AddExactlyOne(y[ci] for ci, c in enumerate(cands) if c[0] == tab)
    base = int(np.ceil(fixed / top * SCALE))
    z = md.NewIntVar(0, SCALE * 4, "z")
    for r in range(W):
        md.Add(sum(k * v for k, v in per_rank_cost[r]) + base <= z)
        for t in range(3):
            if per_rank_mem[t][r]:
                md.Add(sum(k * v for k, v in per_rank_mem[t][r]) <= int(cap[t]))
    # the ranks' total (implied; it tightens the relaxation)
    md.Add(sum(k * v for k, v in zip(totals, y)) + W * base <= W * z)
    md.Minimize(z)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_deterministic_time = WORK
    prm.num_workers = 2
    prm.interleave_search = True
    prm.random_seed = 0
    status = solver.Solve(md)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    out = {}
    for ci, (tab, key, cost, _, _) in enumerate(cands):
        if solver.Value(y[ci]):
            ranks = np.array([next(r for r in range(W) if solver.Value(x[ci][p][r]))
                              for p in range(cost.size)], dtype=np.int64)
            out[tab] = (key, ranks)
    return out
