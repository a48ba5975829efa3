"""The decode steps' CUDA graphs: a ladder of batch sizes, each size's forward captured over the kernel
runner's static inputs in one memory pool, and the graph a batch of n sequences replays (the next size
up the ladder; its padding rows are the runner's to fill). Without CUDA graphs (CPU,
--no-cuda-graphs) each size runs the same forward eagerly over the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# the decode graphs' batch sizes: steps grow with the size, so padding stays a small share of a batch.
# Every size up to 8: a zero padding row routes by the router's bias alone, so at 20b's or 120b's
# few-token steps it reads up to 4 experts a layer that no sequence chose (bench/results v48: 20b
# batch 3 982.1 -> 1,115.9 tok/s, 120b batch 5 781.3 -> 907.0 on an H200).
# Read at each build (graph_ladder), so a bench can time another ladder in the same engine.
GRAPH_SIZES = (
    (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128)
    + tuple(range(160, 257, 32))
    + tuple(range(320, 513, 64))
    + tuple(range(640, 1025, 128))
)


def graph_ladder(max_num_seqs: int) -> list[int]:
    """The decode graphs' sizes for an engine of max_num_seqs: GRAPH_SIZES up to it, and it."""
    sizes = [b for b in GRAPH_SIZES if b <= max_num_seqs]
    return sizes if sizes and sizes[-1] == max_num_seqs else [*sizes, max_num_seqs]


@dataclass(slots=True)
class DecodeGraph:
    """The decode forward at batch size B over the static inputs: a captured CUDA graph, or (no
    graphs: CPU, --no-cuda-graphs) the same forward run eagerly, so both paths share every input."""

    size: int
    graph: torch.cuda.CUDAGraph | None
    hidden: Tensor | None  # [B, H] output; a graph writes it in place, eager replaces it
    forward: object = None  # eager: callable(B) -> hidden

    def replay(self) -> Tensor:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.hidden = self.forward(self.size)
        return self.hidden


class DecodeGraphs:
    """forward(B) -> hidden [B, H] at every ladder size. prepare(B) fills the static inputs of a B-row
    capture (every row padding); capture reads them, replay reads whatever the runner wrote since."""

    def __init__(
        self,
        max_num_seqs: int,
        forward: Callable[[int], Tensor],
        prepare: Callable[[int], None],
        device: torch.device,
        cuda_graphs: bool,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.forward, self.prepare = forward, prepare
        self.device = device
        self.cuda_graphs = cuda_graphs
        self.sizes: list[int] = []
        self.graphs: dict[int, DecodeGraph] = {}

    def build(self) -> None:
        """Every size of the ladder (read now, with the kernels' switches): captured graphs on CUDA,
        else eager forwards over the same static inputs."""
        self.sizes = graph_ladder(self.max_num_seqs)
        if self.cuda_graphs:
            self._capture()
        else:
            self.graphs = {b: DecodeGraph(b, None, None, self.forward) for b in self.sizes}

    def for_batch(self, n: int) -> DecodeGraph | None:
        """The graph n decoding sequences replay: the first size up the ladder that holds them."""
        for b in self.sizes:
            if b >= n:
                return self.graphs.get(b)
        return None

    def _capture(self) -> None:
        """Capture the forward at every ladder size, largest first, in one memory pool."""
        dev = self.device
        self.graphs = {}
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for b in reversed(self.sizes):
                self.prepare(b)
                for _ in range(2):  # compile and warm the kernels at this size
                    self.forward(b)
                torch.cuda.synchronize(dev)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    hidden = self.forward(b)
                self.graphs[b] = DecodeGraph(b, g, hidden)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
