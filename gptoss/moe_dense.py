"""MoE for small models: experts decoded once at load, no per-call MXFP4 decoding.

The reference MoE loops over the experts a batch uses and decodes each from MXFP4 per call:
right for big models, but for a tiny one every step pays ~10 small ops per expert per layer.
Here a small batch (decode) runs every expert on every token: the gate/up projection of all
experts is one matmul, the down projection one batched matmul, and the top-k mixture one
weighted sum (unselected experts weigh 0), at E/k times the expert FLOPs. A large batch
(prefill) groups its tokens by expert instead.

On CPU the decoded weights are kept in float32 and each projection's output is rounded to
the model dtype, as a bf16 GEMM with float32 accumulation rounds it: without AMX, float32
GEMMs are several times faster than bf16 ones at these shapes. ModelRunner uses this module
only when the decoded experts are small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptoss.model import MoE, swiglu

if TYPE_CHECKING:
    from gptoss.lora_stack import LoraStep

DENSE_MAX_TOKENS = 256  # above this, E/k times the elementwise work outweighs the op count


def dense_nbytes(moe: MoE, dtype: torch.dtype) -> int:
    """Bytes the decoded experts of one layer take."""
    e, h = moe.router_weight.shape
    i = moe.experts.gate_up_bias.shape[1] // 2
    return e * 3 * h * i * dtype.itemsize  # gate_up [H, 2I] + down [I, H] per expert


class DenseMoE(nn.Module):
    def __init__(self, moe: MoE) -> None:
        super().__init__()
        ex = moe.experts
        self.top_k, self.alpha, self.limit = moe.top_k, ex.alpha, ex.limit
        self.router_weight, self.router_bias = moe.router_weight, moe.router_bias  # [E, H], [E]
        self.dtype = moe.router_weight.dtype
        on_cpu = moe.router_weight.device.type == "cpu"
        wdtype = torch.float32 if on_cpu else self.dtype  # the GEMMs' dtype (see module doc)
        num_experts, hidden = moe.router_weight.shape
        gate_up, down = zip(*(ex.weights(e) for e in range(num_experts)), strict=True)  # [H, 2I], [I, H] each
        self.gate_up = torch.stack(gate_up).to(wdtype)  # [E, H, 2I]
        # [H, E * 2I]: column block e is expert e's gate_up, so one matmul serves all experts.
        self.gate_up_all = self.gate_up.transpose(0, 1).reshape(hidden, -1).contiguous()
        self.gate_up_bias = ex.gate_up_bias.to(wdtype)  # [E, 2I]
        self.down = torch.stack(down).to(wdtype).contiguous()  # [E, I, H]
        self.down_bias = ex.down_bias.to(wdtype)  # [E, H]

    def forward(self, x: Tensor, lora: LoraStep | None = None) -> Tensor:
        """x [T, H] -> [T, H]; the same mixture as MoE.forward (LoRA: grouped, the deltas per expert)."""
        logits = F.linear(x, self.router_weight, self.router_bias)  # [T, E]
        top_logits, top_idx = torch.topk(logits, self.top_k, dim=-1)  # [T, k]
        top_w = torch.softmax(top_logits.float(), dim=-1)  # [T, k]
        xw = x.to(self.gate_up.dtype)
        if x.shape[0] > DENSE_MAX_TOKENS or lora is not None:
            out = self._grouped(xw, top_idx, top_w, lora)
        else:
            out = self._dense(xw, top_idx, top_w)
        return out.to(x.dtype)

    def _round(self, t: Tensor) -> Tensor:
        """A projection's output as the model dtype holds it."""
        return t if t.dtype == self.dtype else t.to(self.dtype).to(t.dtype)

    def _dense(self, x: Tensor, top_idx: Tensor, top_w: Tensor) -> Tensor:
        t, (e, i, h) = x.shape[0], self.down.shape
        weights = torch.zeros(t, e, dtype=torch.float32, device=x.device)
        weights.scatter_(1, top_idx, top_w)  # [T, E]
        hid = self._round(torch.addmm(self.gate_up_bias.view(-1), x, self.gate_up_all))  # [T, E*2I]
        act = self._round(swiglu(hid.view(t * e, 2 * i), self.alpha, self.limit)).view(t, e, i)
        y = self._round(torch.baddbmm(self.down_bias[:, None], act.transpose(0, 1), self.down))  # [E, T, H]
        return torch.bmm(weights[:, None], y.float().transpose(0, 1)).view(t, h)  # [T, 1, E] @ [T, E, H]

    def _grouped(self, x: Tensor, top_idx: Tensor, top_w: Tensor, lora: LoraStep | None = None) -> Tensor:
        t, k = top_idx.shape
        flat = top_idx.reshape(-1)  # [T*k] expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # grouped by expert
        tok = order // k  # [T*k] token of each assignment
        counts = torch.bincount(flat, minlength=self.down.shape[0]).tolist()
        xs = x.index_select(0, tok)  # [T*k, H]
        ys, a = [], 0
        for e, c in enumerate(counts):
            if c:
                xe, te = xs[a : a + c], tok[a : a + c]
                hid = torch.addmm(self.gate_up_bias[e], xe, self.gate_up[e])  # [c, 2I]
                hid = self._round(self._lora(hid, lora, "gate_up_proj", e, xe, te))
                act = self._round(swiglu(hid, self.alpha, self.limit))
                y = torch.addmm(self.down_bias[e], act, self.down[e])  # [c, H]
                ys.append(self._round(self._lora(y, lora, "down_proj", e, act, te)))
                a += c
        y = torch.cat(ys).float() * top_w.reshape(-1)[order, None]  # [T*k, H]
        return torch.zeros(t, y.shape[1], dtype=torch.float32, device=x.device).index_add_(0, tok, y)

    @staticmethod
    def _lora(y: Tensor, lora: LoraStep | None, target: str, e: int, x: Tensor, tok: Tensor) -> Tensor:
        d = None if lora is None else lora.expert(target, e, x, tok)
        return y if d is None else y + d
