"""The CP-SAT model of tables' options and their pieces on ranks, which the exact stage
(``exact.py``: a plan) and the bound's coupled-pieces term (``coupled.py``: a proof) both solve,
and the options both put in it (``option_keys``, ``cut``).

Every option of a table has a Boolean; exactly one per table is taken. A sharded option's
pieces each take one rank (at most one piece of a table per rank; a host-bound option's pieces
on one host; pieces alike in cost and bytes take ascending ranks, as they are interchangeable);
a replicated option puts its cost and bytes on every rank. Costs and bytes come in integers
(the caller rounds them: up for a plan that must fit, down for a bound); every rank's bytes per
tier stay within ``cap`` and its cost under ``z``, which is minimised, with the ranks' total
under ``W`` x ``z`` (implied; it tightens the relaxation). The search is interleaved over 2
workers under a limit of deterministic time: the same answer on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .context import PlanContext, option_costs
from .shards import build_layout


def option_keys(ctx: PlanContext, tabs: np.ndarray, caches: Sequence[float], upper: float,
                limit: int, slack: float = 0.0) -> list | None:
    """(table, option, tier, cache) of the tables ``tabs``: every sharded option that splits
    over at most every rank, in every tier a table may take (a slow tier with each of
    ``caches``), whose widest piece (one of its pieces) costs less than ``upper`` and fits a
    rank's tier (with ``slack`` bytes). Priced for all tables at once, before any is cut into
    pieces; None where they come to more than ``limit`` (piece, rank) pairs."""
    g, t = ctx.grid, ctx.tables
    keys, cells = [], 0
    for ti in ctx.avail:
        for cf in (0.0,) if ti == ctx.ct else caches:
            oc = option_costs(ctx, np.full(ctx.n, ti), np.full(ctx.n, cf))
            ok = (g.valid & (oc.max < upper) & (g.n_shards <= ctx.W)
                  & (oc.wide_storage <= ctx.budget[ti] + slack))[tabs]
            ok[:, ctx.dp_col] = False
            ok &= ((t.pinned[tabs] < 0) | (t.pinned[tabs] == ti))[:, None]
            cells += int(g.n_shards[tabs][ok].sum()) * ctx.W
            if cells > limit:
                return None
            keys += [(int(tabs[r]), int(j), int(ti), float(cf)) for r, j in zip(*np.nonzero(ok))]
    return keys


def cut(ctx: PlanContext, table: int, key: tuple[int, int, float]):
    """Table ``table`` at ``key`` (option, tier, cache) cut into pieces: (their costs, their
    bytes (pieces, 3), whether they stay in one host)."""
    one = np.full(ctx.n, ctx.dp_col, dtype=np.int64)
    one[table] = key[0]
    part = build_layout(ctx, one, np.full(ctx.n, key[1]), np.full(ctx.n, key[2]))
    return part.cost, part.need, bool(part.host_bound[0])


class PlacementModel:
    def __init__(self, W: int, Lw: int, cap: np.ndarray):
        from ortools.sat.python import cp_model

        self.cp = cp_model
        self.md = cp_model.CpModel()
        self.W, self.Lw, self.H = W, Lw, W // Lw
        self.cap = cap
        self.rank_cost: list[list] = [[] for _ in range(W)]
        self.rank_mem: list[list[list]] = [[[] for _ in range(W)] for _ in range(3)]
        self.table_rank: dict = {}
        self.options: list = []  # (table, Boolean, total cost)
        self.solver = None

    def option(self, table: int, cost: np.ndarray, nbytes: np.ndarray, host_bound: bool,
               name: str = "", hint: tuple[bool, np.ndarray] | None = None):
        """A sharded option: its pieces' integer ``cost`` and ``nbytes`` (pieces, 3); ``hint``:
        (taken, its pieces' ranks). -> (Boolean, per piece its W rank Booleans)."""
        md, W = self.md, self.W
        y = md.NewBoolVar(name)
        self.options.append((table, y, int(cost.sum())))
        if hint is not None:
            md.AddHint(y, hint[0])
        hosts = [md.NewBoolVar("") for _ in range(self.H)] if host_bound and self.H > 1 else None
        if hosts is not None:
            md.Add(sum(hosts) == y)
        rows = []
        for p in range(cost.size):
            row = [md.NewBoolVar("") for _ in range(W)]
            md.Add(sum(row) == y)
            for r, v in enumerate(row):
                self.rank_cost[r].append((int(cost[p]), v))
                for t in range(3):
                    if nbytes[p, t] > 0:
                        self.rank_mem[t][r].append((int(nbytes[p, t]), v))
                self.table_rank.setdefault((table, r), []).append(v)
                if hosts is not None:
                    md.AddImplication(v, hosts[r // self.Lw])
                if hint is not None:
                    md.AddHint(v, bool(hint[0] and hint[1][p] == r))
            rows.append(row)
        # pieces alike are interchangeable: their ranks ascending (one of each such set)
        for p in range(cost.size - 1):
            if cost[p] == cost[p + 1] and (nbytes[p] == nbytes[p + 1]).all():
                md.Add(sum(r * v for r, v in enumerate(rows[p]))
                       < sum(r * v for r, v in enumerate(rows[p + 1]))).OnlyEnforceIf(y)
        return y, rows

    def replicated(self, table: int, cost: int, nbytes: np.ndarray):
        """A replicated option: ``cost`` and ``nbytes`` (3,) on every rank."""
        y = self.md.NewBoolVar("")
        self.options.append((table, y, cost * self.W))
        for r in range(self.W):
            self.rank_cost[r].append((cost, y))
            for t in range(3):
                if nbytes[t] > 0:
                    self.rank_mem[t][r].append((int(nbytes[t]), y))
        return y

    def solve(self, work: float, bound: int, base: int = 0) -> int:
        """Minimise the slowest rank (``base`` on every rank besides its pieces; at most
        ``bound``) within ``work`` units of deterministic time; -> the solver's status."""
        md, W = self.md, self.W
        for vs in self.table_rank.values():
            md.Add(sum(vs) <= 1)
        for tab in sorted({t for t, _, _ in self.options}):
            md.AddExactlyOne(y for t, y, _ in self.options if t == tab)
        z = md.NewIntVar(0, bound, "z")
        for r in range(W):
            md.Add(sum(k * v for k, v in self.rank_cost[r]) + base <= z)
            for t in range(3):
                if self.rank_mem[t][r]:
                    md.Add(sum(k * v for k, v in self.rank_mem[t][r]) <= int(self.cap[t]))
        md.Add(sum(k * y for _, y, k in self.options) + W * base <= W * z)
        md.Minimize(z)
        self.solver = self.cp.CpSolver()
        prm = self.solver.parameters
        prm.max_deterministic_time = work
        prm.num_workers = 2
        prm.interleave_search = True
        prm.random_seed = 0
        return self.solver.Solve(md)

    def found(self, status: int) -> bool:
        return status in (self.cp.OPTIMAL, self.cp.FEASIBLE)

    def infeasible(self, status: int) -> bool:
        return status == self.cp.INFEASIBLE
