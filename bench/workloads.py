"""The training workloads timed by bench/step_time.py and checked by tests/gpu.

ResNet-50 (torchvision) and a small GPT-style transformer, each one SGD step per
iteration on a fixed synthetic batch, timed with CUDA events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Workload = tuple[Any, Any, Any]  # model, batch, target


class TinyGPT(torch.nn.Module):  # type: ignore[misc,unused-ignore]  # torch: Any in lint
    def __init__(self, vocab: int = 4096, d: int = 512, layers: int = 6, seq: int = 256) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(1, seq, d))
        layer = torch.nn.TransformerEncoderLayer(
            d, nhead=8, dim_feedforward=4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, idx: Any) -> Any:
        h = self.tok(idx) + self.pos[:, : idx.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def resnet50() -> Workload:
    import torchvision

    model = torchvision.models.resnet50(weights=None, num_classes=100).cuda()
    batch = torch.randn(64, 3, 224, 224, device="cuda")
    target = torch.randint(0, 100, (64,), device="cuda")
    return model, batch, target


def gpt() -> Workload:
    model = TinyGPT().cuda()
    data = torch.randint(0, 4096, (16, 257), device="cuda")
    return model, data[:, :-1], data[:, 1:]


WORKLOADS: dict[str, Callable[[], Workload]] = {"resnet50": resnet50, "gpt": gpt}


def train_steps(workload: Workload, steps: int) -> tuple[list[float], list[float]]:
    """Run ``steps`` SGD steps; return every step's loss and CUDA-event time in ms."""
    model, batch, target = workload
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses: list[Any] = []
    events = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        out = model(batch)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        end.record()
        losses.append(loss.detach())
        events.append((start, end))
    torch.cuda.synchronize()
    return [float(v) for v in losses], [s.elapsed_time(e) for s, e in events]
