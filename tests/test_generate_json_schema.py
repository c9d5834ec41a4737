"""``lightspeed generate --json-schema FILE``: generation masked by a JSON schema (lightspeed.structured) gives
JSON that satisfies it, greedy and sampled; bad files and schemas the grammar library refuses are clear errors.
On SmolLM2 (skipped without the model package)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from lightspeed.cli_generate import read_schema, schema_constraint  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}}


@pytest.fixture(scope="module")
def model():
    import lightspeed.api as lsa
    try:
        lsa.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return lsa.load(None, ctx=512, progress=False)


def test_outputs_satisfy_the_schema_greedy_and_sampled(model) -> None:
    for seed in [None] + list(range(6)):
        gen = model.generate("Describe a person as JSON:", max_tokens=120, temperature=0.0 if seed is None else 1.2,
                             seed=seed)
        gen.constraint = schema_constraint(SCHEMA, model)
        text = gen.run()
        assert gen.finish_reason == "stop", (seed, text)  # the grammar completed, nothing cut
        jsonschema.validate(json.loads(text), SCHEMA)
    plain = model.generate("Describe a person as JSON:", max_tokens=20).run()
    with pytest.raises(ValueError):
        json.loads(plain)  # without the mask this model writes prose here


def test_bad_schemas_are_named(model, tmp_path) -> None:
    with pytest.raises(ValueError, match="refused by the grammar engine"):
        schema_constraint({"type": "object", "not": {}}, model, "s.json")
    cases = {"missing.json": None, "broken.json": "{\"type\": ", "list.json": "[1, 2]"}
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match="missing.json: No such file"):
        read_schema(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="broken.json: not a JSON file"):
        read_schema(str(tmp_path / "broken.json"))
    with pytest.raises(ValueError, match="list.json: a JSON schema is an object, not list"):
        read_schema(str(tmp_path / "list.json"))


def test_cli(model, tmp_path) -> None:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(SCHEMA))
    run = subprocess.run([sys.executable, "-m", "lightspeed", "generate", "--json-schema", str(path), "--json",
                          "--ctx", "512", "--max-tokens", "120", "--temperature", "0.9", "--seed", "7", "A person:"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["finish_reason"] == "stop"
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    bad = subprocess.run([sys.executable, "-m", "lightspeed", "generate", "--json-schema", str(tmp_path / "none.json"),
                          "x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "none.json: No such file or directory" in bad.stderr
    assert "Traceback" not in bad.stderr
