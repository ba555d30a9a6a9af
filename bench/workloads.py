"""The training workloads timed by bench/step_time.py and checked by tests/gpu.

ResNet-50 (torchvision), a small GPT-style transformer and a tiny one, each one SGD step
per iteration on a fixed synthetic batch, timed with CUDA events. The first two keep the
GPU busy; ``gpt-tiny``'s step is bound by the host (launches and allocations), where
whatever the +um torch adds to an allocation shows in full.
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


def gpt_tiny() -> Workload:
    model = TinyGPT(d=128, layers=4, seq=64).cuda()
    data = torch.randint(0, 4096, (2, 65), device="cuda")
    return model, data[:, :-1], data[:, 1:]


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "resnet50": resnet50,
    "gpt": gpt,
    "gpt-tiny": gpt_tiny,
}


def sgd_stepper(
    workload: Workload, mark: Callable[[], None] | None = None
) -> Callable[[], Any]:
    """A function that runs one SGD step of ``workload`` (momentum 0.9, cross-entropy)
    each time it is called, and returns the step's loss. ``mark``, if given, is called
    after each phase: the forward with the loss, the backward, the optimizer step."""
    model, batch, target = workload
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    phase_done = mark if mark is not None else lambda: None

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        out = model(batch)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        phase_done()
        loss.backward()
        phase_done()
        opt.step()
        phase_done()
        return loss

    return step


def train_steps(workload: Workload, steps: int) -> tuple[list[float], list[float]]:
    """Run ``steps`` SGD steps; return every step's loss and CUDA-event time in ms."""
    step = sgd_stepper(workload)
    losses: list[Any] = []
    events = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        losses.append(loss.detach())
        events.append((start, end))
    torch.cuda.synchronize()
    return [float(v) for v in losses], [s.elapsed_time(e) for s, e in events]


def staged_mlp_run(
    make_opt: Callable[[Any], Any], um: Any = None, hooked: bool = False
) -> tuple[list[float], list[Any]]:
    """Eight steps of a 6-layer MLP (57 MB of fp32 weights, as much in gradients, ~300 MB
    of saves) with the given optimizer and a StepLR; the losses and the final weights (on
    the CPU). Checked bit for bit by tests/gpu (optimizer state staging) and counted by
    bench/probes/divergence_probe.py. With ``um``, the optimizer state is sent to host RAM after
    each step, as a larger forward would push it there: this small model's state would
    otherwise stay on the device. ``hooked``: a step pre-hook of the program's own, which
    turns the staging off (Note [Optimizer state staging])."""
    torch.manual_seed(11)
    blocks = [torch.nn.Sequential(torch.nn.Linear(1536, 1536), torch.nn.Tanh()) for _ in range(6)]
    model = torch.nn.Sequential(*blocks).cuda()
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    if hooked:
        opt.register_step_pre_hook(lambda o, args, kwargs: None)
    x = torch.randn(4096, 1536, device="cuda", generator=torch.Generator("cuda").manual_seed(12))
    losses = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if um is not None:
            state = [t for st in opt.state.values() for t in st.values()]
            um.prefetch([t for t in state if isinstance(t, torch.Tensor) and t.is_cuda], "cpu")
    return losses, [p.detach().cpu() for p in model.parameters()]


def release_cache() -> None:
    """Free every cached segment, cuBLAS workspaces included (they are allocator blocks
    whose segments would otherwise host later allocations of another UM setting)."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
