"""The streaming attention kernel reads its queries and keys; it never recomputes their projection or rotation
for every score. At a sequence as long as the head width (64 and 64) the queries are as large as the scores,
and a size rule alone took the projection into the kernel (HF Llama at hidden 384: 300 ms per attention)."""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lightspeed.kernel import ir  # noqa: E402
from lightspeed.ops import Op  # noqa: E402
from lightspeed.runtime import CompiledGraph  # noqa: E402


def _programs() -> list[CompiledGraph]:
    out = []
    for o in gc.get_objects():
        try:
            if type(o) is CompiledGraph:
                out.append(o)
        except ReferenceError:
            pass
    return out


def test_hf_llama_attention_reads_its_rotated_queries_and_keys() -> None:
    import lightspeed.torch_backend  # noqa: F401  (registers the backend)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 64))
    torch._dynamo.reset()
    before = {id(p) for p in _programs()}
    with torch.no_grad():
        out = torch.compile(model, backend="lightspeed")(input_ids=ids).logits
        torch.testing.assert_close(out, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    kernels = [k for p in _programs() if id(p) not in before for k in p.executor.plan.kernels
               if k.kind == "attention"]
    assert kernels
    for k in kernels:
        roots = [x for x in vars(k.template).values() if isinstance(x, ir.IR)]
        nodes = list({id(x): x for r in roots for x in r.walk()}.values())  # (mask_score shares the score's)
        assert [x.size for x in nodes if isinstance(x, ir.Reduce)] == [64]  # q . k over the head width only
        assert not any(isinstance(x, ir.Alu) and x.op is Op.SIN for x in nodes)  # no rotation per score
    torch._dynamo.reset()
