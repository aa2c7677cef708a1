"""Progress for long work: a tqdm bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("recscale.progress")


class Progress:
    """``update(done)`` with an absolute count; ``mode``: auto | bar | log | off."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", mode: str = "auto",
                 log_every_s: float = 10.0):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "log"
        self.mode, self.total, self.desc, self.unit = mode, total, desc, unit
        self.log_every_s = log_every_s
        self._done = 0
        self._t0 = self._last = time.perf_counter()
        self._bar = None
        if mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, dynamic_ncols=True)

    def update(self, done: int, total: int | None = None, **postfix) -> None:
        if total is not None and total != self.total:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
        if self._bar is not None:
            self._bar.update(done - self._done)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
        elif self.mode == "log":
            now = time.perf_counter()
            if now - self._last >= self.log_every_s or (self.total and done >= self.total):
                self._last = now
                pct = f" ({100.0 * done / self.total:.0f}%)" if self.total else ""
                extra = "".join(f" {k}={v}" for k, v in postfix.items())
                log.info("%s: %d/%s %s%s, %.0fs%s", self.desc, done, self.total or "?", self.unit,
                         pct, now - self._t0, extra)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
