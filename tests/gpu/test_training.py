"""ResNet-50 and a small GPT-style transformer train with UM on and off.

Same seed, same data: the losses agree within floating-point tolerance. The
data fits on the GPU, so the steady-state step time with UM must be within 2 %
of stock (blocks alternate on/off/on/off; the best block of each is compared).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest

from tests.gpu.conftest import Limits, release_cache

torch = pytest.importorskip("torch")

LOSS_STEPS = 6
WARMUP = 5
TIMED = 15
MAX_RATIO = 1.02


def _train(
    um: Any,
    enabled: bool,
    make: Callable[[], tuple[Any, Any, Any]],
    steps: int,
    timed_from: int,
) -> tuple[list[float], list[float]]:
    um.configure(enabled=enabled)
    release_cache(torch)
    torch.manual_seed(0)
    # Segments that outlive release_cache (partly used by tensors held elsewhere) keep
    # the kind of memory they were made with; only segments made from here on must
    # follow the mode.
    earlier = {seg["address"] for seg in torch.cuda.memory_snapshot()}
    model, batch, target = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses: list[Any] = []
    times: list[float] = []
    events = []
    for step in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        out = model(batch)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        end.record()
        losses.append(loss.detach())
        if step >= timed_from:
            events.append((start, end))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    params = list(model.parameters())
    segments = [
        (seg["address"], seg["address"] + seg["total_size"])
        for seg in torch.cuda.memory_snapshot()
        if seg["address"] not in earlier
    ]
    in_new = [p for p in params if any(lo <= p.data_ptr() < hi for lo, hi in segments)]
    wrong = [p for p in in_new if um.is_managed(p) != enabled]
    share = sum(p.numel() for p in in_new) / sum(p.numel() for p in params)
    assert share > 0.9, f"only {share:.0%} of the parameters are in segments made by this run"
    assert not wrong, (
        f"{len(wrong)} parameters in new segments are {'not ' if enabled else ''}managed "
        f"with UM {'on' if enabled else 'off'}"
    )
    return [float(v) for v in losses], times


def _compare(name: str, um: Any, make: Callable[[], tuple[Any, Any, Any]]) -> None:
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    steps = WARMUP + TIMED
    blocks: dict[bool, list[float]] = {True: [], False: []}
    losses: dict[bool, list[float]] = {}
    try:
        for enabled in (True, False) * 3:
            ls, times = _train(um, enabled, make, steps, WARMUP)
            losses.setdefault(enabled, ls)
            blocks[enabled].append(statistics.median(times))
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved
    on, off = losses[True][:LOSS_STEPS], losses[False][:LOSS_STEPS]
    print(f"[{name}] losses UM on  {[f'{v:.6f}' for v in on]}")
    print(f"[{name}] losses UM off {[f'{v:.6f}' for v in off]}")
    assert on == pytest.approx(off, rel=1e-3, abs=1e-4)
    assert on[-1] < on[0], "loss did not go down"
    ratio = min(blocks[True]) / min(blocks[False])
    print(
        f"[{name}] steady-state step time UM {min(blocks[True]):.2f} ms, stock "
        f"{min(blocks[False]):.2f} ms, UM/stock {ratio:.3f} (blocks on {blocks[True]}, off {blocks[False]})"
    )
    assert ratio <= MAX_RATIO, f"UM/stock step time {ratio:.3f} > {MAX_RATIO}"


def test_resnet50(torch_mod: Any, um: Any, limits: Limits) -> None:
    torchvision = pytest.importorskip("torchvision")

    def make() -> tuple[Any, Any, Any]:
        model = torchvision.models.resnet50(weights=None, num_classes=100).cuda()
        batch = torch.randn(64, 3, 224, 224, device="cuda")
        target = torch.randint(0, 100, (64,), device="cuda")
        return model, batch, target

    _compare("resnet50", um, make)


class TinyGPT(torch.nn.Module):
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


def test_small_gpt(torch_mod: Any, um: Any, limits: Limits) -> None:
    def make() -> tuple[Any, Any, Any]:
        model = TinyGPT().cuda()
        data = torch.randint(0, 4096, (16, 257), device="cuda")
        return model, data[:, :-1], data[:, 1:]

    _compare("gpt", um, make)
