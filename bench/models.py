"""The models bench.residency runs, built from a fixed seed, with the same weights in every
worker of a run.

Two decoder-only layouts about the same size, so that a result is not one model's:

- ``gpt2-1.28b`` (the default, every result before prediction step 34):
  ``GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=2048, n_head=16, vocab_size=32000,
  n_positions=1024))``: transformers' ``Conv1D`` projections, GELU, layer norm, learned
  positions, the head tied to the embedding. 1.28 B parameters.
- ``llama-1.1b``: ``LlamaForCausalLM(LlamaConfig(hidden_size=2048,
  intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
  num_key_value_heads=4, vocab_size=32000))``, TinyLlama's shape: ``nn.Linear``
  projections, grouped-query attention, a SiLU-gated MLP, RMSNorm, rotary positions, an
  untied head. 1.10 B parameters.

Both in bf16, with dropout 0, no KV cache in training and no end-of-text token (so that
every ``generate`` step adds all its tokens in every mode). No weights are downloaded.

Initialising a billion parameters on the CPU takes about a minute, so the first worker of a
run saves every parameter and buffer (persistent or not) under ``/tmp`` (or
``$TORCH_UM_BENCH_WEIGHTS_DIR``) and the others build the model on the meta device and
assign those tensors, memory-mapped.
"""

from __future__ import annotations

import importlib
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_FORMAT = 2  # bumped when what the cache file holds changes


@dataclass(frozen=True)
class ModelSpec:
    """One model of the benchmark: its transformers classes and settings, and where its
    repeated block lies (FSDP2 shards per block; accelerate does not split one)."""

    name: str
    model_class: str  # transformers.<model_class>(config)
    config_class: str  # transformers.<config_class>(**config)
    config: dict[str, Any]
    block: str  # the class name of its decoder layer
    layers: str  # the attribute path of the list of decoder layers
    about: str = field(default="", compare=False)  # for titles and tables

    def blocks(self, model: Any) -> list[Any]:
        return list(operator.attrgetter(self.layers)(model))


# No KV cache in training, and no end-of-text token: GPT-2's own ids (50256) lie past the
# 32000-token vocabulary, and with none every generation (``generate``) runs all its new
# tokens, so that all modes do the same work.
_NO_CACHE_NO_END = {"use_cache": False, "bos_token_id": None, "eos_token_id": None}

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="gpt2-1.28b",
            model_class="GPT2LMHeadModel",
            config_class="GPT2Config",
            config={
                "n_layer": 24,
                "n_embd": 2048,
                "n_head": 16,
                "vocab_size": 32000,
                "n_positions": 1024,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                **_NO_CACHE_NO_END,
            },
            block="GPT2Block",
            layers="transformer.h",
            about="GPT-2-style 1.28 B",
        ),
        ModelSpec(
            name="llama-1.1b",
            model_class="LlamaForCausalLM",
            config_class="LlamaConfig",
            config={
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 22,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "vocab_size": 32000,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": False,
                "attention_dropout": 0.0,
                "pad_token_id": None,
                **_NO_CACHE_NO_END,
            },
            block="LlamaDecoderLayer",
            layers="model.layers",
            about="Llama-style 1.1 B",
        ),
    )
}
DEFAULT = "gpt2-1.28b"


def spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None


def cache_path(s: ModelSpec) -> Path:
    root = Path(os.environ.get("TORCH_UM_BENCH_WEIGHTS_DIR", "/tmp"))
    return root / f"torch-um-bench-{s.name}.v{CACHE_FORMAT}.pt"


def _assign(model: Any, name: str, tensor: Any, torch: Any) -> None:
    """Put ``tensor`` where the parameter or buffer ``name`` of ``model`` is."""
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if attr in owner._parameters:
        old = owner._parameters[attr]
        owner._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=old.requires_grad)
    else:
        owner._buffers[attr] = tensor


def build(torch: Any, name: str = DEFAULT) -> Any:
    """The model ``name`` in bf16 on the CPU, in training mode, the same weights every time
    (module docstring)."""
    s = spec(name)
    transformers = importlib.import_module("transformers")
    config = getattr(transformers, s.config_class)(**s.config)
    model_class = getattr(transformers, s.model_class)
    cache = cache_path(s)
    if cache.is_file():
        with torch.device("meta"):
            model = model_class(config)
        tensors = torch.load(cache, mmap=True, weights_only=True)
        for key, tensor in tensors.items():
            _assign(model, key, tensor, torch)
        model.tie_weights()
        if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            return model.train()
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = model_class(config)
    finally:
        torch.set_default_dtype(default)
    for p in model.parameters():  # buffers keep their dtype (Llama's rotary frequencies)
        p.data = p.data.to(torch.bfloat16)
    tensors = {k: t.detach() for k, t in model.named_parameters()}
    tensors.update(model.named_buffers())
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.partial")
    torch.save(tensors, partial)
    os.replace(partial, cache)
    return model.train()
