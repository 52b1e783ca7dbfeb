"""codegen helper: stage timings, logged, with a progress bar for long builds.

Imports logging, sys, time and tqdm only; every stage of a build goes through one Stopwatch.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

log = logging.getLogger("symkern")

#: the stages of a build, and of a kernel's first call, in order
BUILD_STAGES = ("cse", "emit", "rewrite", "python_compile")
CALL_STAGES = ("trace", "lower", "xla_compile")


class Stopwatch:
    """Times named stages into `timings`; logs each with its share of the total so far.

    `progress=None` shows a tqdm bar only when stderr is a terminal; `False` never does.
    """

    def __init__(self, timings: dict[str, float] | None = None, progress: bool | None = None,
                 label: str = "symkern build", stages: tuple[str, ...] = BUILD_STAGES) -> None:
        self.timings = {} if timings is None else timings
        show = sys.stderr.isatty() if progress is None else bool(progress)
        self._bar = tqdm(total=len(stages), desc=label, unit="stage", disable=not show,
                         leave=False) if show else None
        self.label = label

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._bar is not None:
            self._bar.set_postfix_str(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings[name] = self.timings.get(name, 0.0) + elapsed
            total = sum(self.timings.values()) or 1.0
            log.info("%s: %s took %.3f s (%.0f%% of %.3f s so far)", self.label, name, elapsed,
                     100 * elapsed / total, total)
            if self._bar is not None:
                self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
