"""The module zoo through torch.compile(backend="lightspeed") on the C backend, compared with eager.

Models (random weights, small configs): an MLP, a small CNN (conv, batch norm, max/avg/adaptive
pooling), nn.TransformerEncoderLayer, and Hugging Face Llama, GPT-2 and BERT. Each runs with
static shapes and with ``dynamic=True``; the dynamic run must serve a second batch size and
sequence length without a new compilation (neither by PyTorch nor by Lightspeed).

Tolerance: float32 outputs within atol 1e-4 + rtol 1e-4 of eager (Lightspeed composes
transcendental functions from exp2/log2/sin and sums in its own order).

The models are also used by benchmarks/torch_zoo.py.
"""
from __future__ import annotations

from typing import Callable

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomise_batch_norm(model: nn.Module, seed: int) -> None:
    """Non-trivial running statistics, so that eval-mode batch norm does something."""
    g = _seeded(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.LayerNorm(hidden), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x).softmax(-1)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def mlp() -> tuple[nn.Module, Callable]:
    torch.manual_seed(0)
    return MLP().eval(), lambda b, s: {"x": torch.randn(b, 32, generator=_seeded(b * 100 + s))}


def cnn() -> tuple[nn.Module, Callable]:
    torch.manual_seed(1)
    m = SmallCNN().eval()
    _randomise_batch_norm(m, 1)
    return m, lambda b, s: {"x": torch.randn(b, 3, s, s, generator=_seeded(b * 100 + s))}


def encoder_layer() -> tuple[nn.Module, Callable]:
    torch.manual_seed(2)
    m = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    return m, lambda b, s: {"src": torch.randn(b, s, 32, generator=_seeded(b * 100 + s))}


def _ids(b: int, s: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (b, s), generator=_seeded(b * 100 + s))


def _padding_mask(b: int, s: int) -> torch.Tensor:
    mask = torch.ones(b, s, dtype=torch.long)
    if s > 2:
        mask[0, : s // 3] = 0  # left padding in the first row
    return mask


def llama() -> tuple[nn.Module, Callable]:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      attn_implementation="sdpa")
    m = LlamaForCausalLM(cfg).eval()
    return m, lambda b, s: {"input_ids": _ids(b, s, 96), "attention_mask": _padding_mask(b, s),
                            "use_cache": False}


def gpt2() -> tuple[nn.Module, Callable]:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(4)
    cfg = GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                     eos_token_id=0, attn_implementation="sdpa")
    m = GPT2LMHeadModel(cfg).eval()
    return m, lambda b, s: {"input_ids": _ids(b, s, 96), "use_cache": False}


def bert() -> tuple[nn.Module, Callable]:
    from transformers import BertConfig, BertModel
    torch.manual_seed(5)
    cfg = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, attn_implementation="sdpa")
    m = BertModel(cfg).eval()
    return m, lambda b, s: {"input_ids": _ids(b, s, 96), "attention_mask": _padding_mask(b, s)}


ZOO: dict[str, Callable] = {"mlp": mlp, "cnn": cnn, "encoder_layer": encoder_layer, "llama": llama, "gpt2": gpt2,
                            "bert": bert}


def main_output(out) -> torch.Tensor:
    """The tensor a model's result is judged by (logits, last hidden state, or the output itself)."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    raise TypeError(f"no tensor output in {type(out).__name__}")


# --------------------------------------------------------------------------------------------
# tests

RTOL = ATOL = 1e-4
HF = ("llama", "gpt2", "bert")


def _needs(name: str) -> None:
    if name in HF:
        pytest.importorskip("transformers")


def _run(model, kwargs):
    with torch.no_grad():
        return main_output(model(**kwargs))


def _fresh_compile(name: str, **options):
    """(the eager model, its input maker, the model under torch.compile with Lightspeed), with Dynamo's
    caches and Lightspeed's counters reset."""
    _needs(name)
    from lightspeed.torch_backend import STATS
    model, make = ZOO[name]()
    torch._dynamo.reset()
    STATS.reset()
    return model, make, torch.compile(model, backend="lightspeed", **options)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_static(name):
    from lightspeed.torch_backend import STATS
    model, make, compiled = _fresh_compile(name)
    kwargs = make(2, 8)
    torch.testing.assert_close(_run(compiled, kwargs), _run(model, kwargs), rtol=RTOL, atol=ATOL)
    assert STATS.fx_graphs >= 1 and STATS.eager_nodes == 0


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_dynamic(name):
    from lightspeed.torch_backend import STATS
    model, make, compiled = _fresh_compile(name, dynamic=True)
    first = make(2, 8)
    torch.testing.assert_close(_run(compiled, first), _run(model, first), rtol=RTOL, atol=ATOL)
    graphs, builds = STATS.fx_graphs, STATS.builds
    assert graphs >= 1
    # another batch size and sequence length (image size for the CNN): no new compilation
    second = make(3, 12)
    torch.testing.assert_close(_run(compiled, second), _run(model, second), rtol=RTOL, atol=ATOL)
    assert (STATS.fx_graphs, STATS.builds) == (graphs, builds), "a new shape triggered a recompilation"
