"""Recording what the torch backend compiles, for tests that inspect its programs and kernel plans."""
from __future__ import annotations


def record_built_graphs(monkeypatch, torch) -> list:
    """Every ``CompiledFxGraph`` the torch backend builds from now on (its program, its kernel plan), with
    dynamo's caches reset so that models compile afresh."""
    from lightspeed.torch_backend import compiled, register
    register()
    graphs: list = []
    orig = compiled.CompiledFxGraph._build

    def build(self):
        orig(self)
        graphs.append(self)
    monkeypatch.setattr(compiled.CompiledFxGraph, "_build", build)
    torch._dynamo.reset()
    return graphs
