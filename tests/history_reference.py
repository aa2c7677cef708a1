"""A history feature by its definition, with pandas: for each row, the item of the same key's
rows strictly before its time, ordered by (time, row), the last ``max_len`` (rows without a key
or time: none). The reference the history builder (recscale.data.history) is tested against."""

import pandas as pd


def histories(df: pd.DataFrame, key: str, item: str, time: str, max_len: int,
              rows=None) -> list[list]:
    """-> for each row of ``df`` (or only ``rows``, positions), its history's items."""
    d = df.reset_index(drop=True).reset_index(names="_row")
    ok = d.dropna(subset=[key, time]).sort_values([key, time, "_row"], kind="stable")
    want = set(range(len(df)) if rows is None else [int(r) for r in rows])
    out = {r: [] for r in want}
    for _, g in ok.groupby(key, sort=False):
        times, items, own = g[time].to_numpy(), g[item].to_numpy(), g["_row"].to_numpy()
        for i, r in enumerate(own):
            if r in want:
                before = items[:i][times[:i] < times[i]]
                before = before[~pd.isna(before)]
                out[r] = before.tolist()[-max_len:]
    return [out[r] for r in (range(len(df)) if rows is None else [int(x) for x in rows])]
