"""The Triton kernels specialized inside a timed block: compiled, or loaded from Triton's disk cache.

A first engine process on a fresh machine pays that inside its timing: 20b Offline 1000 x (1024 ->
1024) ran 18,652.8 tok/s cold against 22,367.2 warm on one H200 (bench/results v44). A bench row
that carries the count and the seconds says which kind of figure it is:

    with CompileWatch() as w:
        ...timed work...
    w.count, w.seconds, w.note(), w.kernels(), w.fields()

It chains Triton's jit_cache_hook (called before each specialization's compile) and
jit_post_compile_hook (after it), restoring whatever hooks were there on exit.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from triton import knobs


def describe(kw: dict) -> str:
    """One specialization in words: warps, stages, each constexpr (and argument fixed at 1 or None)
    by name, and the arguments specialized as multiples of 16. Triton 3.6's own repr pairs the
    parameters with its key's parts, which no longer line up (it stops at the first argument); it is
    the fallback when the compile arguments are missing."""
    c, fn = kw.get("compile") or {}, kw["fn"]
    names = getattr(getattr(fn, "jit_function", None), "arg_names", None)
    if not names or "constants" not in c:
        return kw.get("repr", fn.name)

    def arg(path: tuple) -> str:
        return ".".join(names[path[0]] if i == 0 else str(p) for i, p in enumerate(path))

    consts = ", ".join(f"{arg(k)}={v}" for k, v in sorted(c["constants"].items()))
    attrs = (c.get("configs") or [{}])[0]
    div16 = ", ".join(arg(k) for k, a in sorted(attrs.items()) if ["tt.divisibility", 16] in map(list, a))
    return f"{fn.name}[warps={c.get('num_warps')}, stages={c.get('num_stages')}]({consts}; div16: {div16})"


@dataclass
class CompileWatch:
    count: int = 0  # specializations made inside the block
    seconds: float = 0.0  # their compile (or disk-cache load) time
    names: list[str] = field(default_factory=list)  # the kernels, one entry a specialization
    # Triton's repr of each: warps, stages and every argument's type or constexpr value, so a
    # figure's cold compiles say what start-up would have to warm
    specs: list[str] = field(default_factory=list)
    _prev: tuple = (None, None)
    _start: float | None = None

    def __enter__(self) -> CompileWatch:
        rt = knobs.runtime
        self._prev = (rt.jit_cache_hook, rt.jit_post_compile_hook)
        rt.jit_cache_hook, rt.jit_post_compile_hook = self._before, self._after
        return self

    def __exit__(self, *exc: object) -> None:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._prev

    def _before(self, **kw):
        # A hook before ours may answer True: Triton then skips the compile, and so do we
        skip = self._prev[0](**kw) if self._prev[0] else None
        if not skip:
            self._start = time.perf_counter()
        return skip

    def _after(self, **kw):
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None
        self.count += 1
        self.names.append(kw["fn"].name)
        self.specs.append(describe(kw))
        if self._prev[1]:
            self._prev[1](**kw)

    def kernels(self) -> dict[str, int]:
        """Kernel name -> specializations inside the block, most first."""
        return dict(Counter(self.names).most_common())

    def fields(self) -> dict:
        """A timed row's fields: the count, the seconds, the kernels and each one's repr (its
        constexprs, for start-up's warm-up to cover); said on stderr when there were any."""
        if self.count:
            kernels = ", ".join(f"{k} x{n}" for k, n in self.kernels().items())
            print(
                f"warning: {self.note()}; a warm process times without them: {kernels}",
                file=sys.stderr,
                flush=True,
            )
        return {
            "jit_specializations": self.count,
            "jit_s": round(self.seconds, 2),
            "jit_kernels": self.kernels(),
            "jit_specs": self.specs,
        }

    def note(self) -> str:
        """'' when nothing was specialized; else how many and how long, for a table's notes."""
        if not self.count:
            return ""
        return f"{self.count} Triton specializations inside the timing ({self.seconds:.1f} s: a cold cache)"
