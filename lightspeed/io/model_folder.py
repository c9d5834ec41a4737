"""A Hugging Face model folder: config.json, tokenizer files and (sharded) safetensors weights.

    mf = load_model_folder("path/to/SmolLM2-135M-Instruct")
    mf.config["hidden_size"]            # config.json as a dict
    mf.tensors["model.norm.weight"]     # SafeTensor across all shards (memory-mapped)
    mf.tokenizer_json                   # path of tokenizer.json, or None
    mf.tokenizer_config                 # tokenizer_config.json as a dict ({} if absent)
    mf.special_tokens                   # {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", ...}
    mf.chat_template                    # the Jinja2 template string, or None
    mf.generation_config                # generation_config.json as a dict ({} if absent)

Weights come from ``model.safetensors``, or from the shards that
``model.safetensors.index.json`` names, or else from every ``*.safetensors`` file.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ModelFormatError
from .files import open_regular, require_regular
from .safetensors import SafeTensor, SafetensorsFile, load_safetensors

INDEX_NAME = "model.safetensors.index.json"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


@dataclass
class ModelFolder:
    path: str
    config: dict[str, Any]
    tensors: dict[str, SafeTensor]
    files: list[SafetensorsFile]
    tokenizer_json: str | None = None
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None

    @property
    def special_tokens(self) -> dict[str, str]:
        """The special token strings that tokenizer_config.json names (AddedToken objects flattened)."""
        out = {}
        for key in SPECIAL_TOKEN_KEYS:
            v = self.tokenizer_config.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                out[key] = v
        return out

    def close(self) -> None:
        for f in self.files:
            f.close()


def read_json(path: str, required: bool = True, kind: type = dict) -> Any:
    """A JSON file's content, ``{}`` if it is optional and absent; ModelFormatError if it is malformed."""
    if not os.path.exists(path):
        if required:
            raise ModelFormatError(path, "missing")
        return kind()
    try:
        with open_regular(path) as f:  # a FIFO named config.json is refused, never waited on
            value = json.loads(f.read().decode("utf-8"))
    except ModelFormatError:
        raise
    except OSError as e:
        raise ModelFormatError(path, f"cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelFormatError(path, f"not valid JSON ({e})") from None
    if not isinstance(value, kind):
        raise ModelFormatError(path, f"expected a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _chat_template(folder: str, tokenizer_config: dict[str, Any]) -> str | None:
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja):
        with open_regular(jinja) as f:
            try:
                return f.read().decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModelFormatError(jinja, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    t = tokenizer_config.get("chat_template")
    if t is None:
        t = read_json(os.path.join(folder, "chat_template.json"), required=False).get("chat_template")
    if isinstance(t, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default", next(iter(named.values()), None))
    if t is not None and not isinstance(t, str):
        raise ModelFormatError(os.path.join(folder, "tokenizer_config.json"), "chat_template must be a string")
    return t


def _shard_files(folder: str) -> tuple[list[str], dict[str, str] | None]:
    """The weight files to open, and the index's name -> file map when there is one."""
    index_path = os.path.join(folder, INDEX_NAME)
    if os.path.exists(index_path):
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in weight_map.items()):
            raise ModelFormatError(index_path, "weight_map must map tensor names to file names")
        for shard in set(weight_map.values()):
            if os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise ModelFormatError(index_path, f"shard {shard!r} is not a plain file name in the folder")
            if not os.path.exists(os.path.join(folder, shard)):
                raise ModelFormatError(index_path, f"shard {shard!r} is missing from {folder}")
        return sorted(set(weight_map.values())), weight_map
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return ["model.safetensors"], None
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(folder), "*.safetensors")))
    if not found:
        raise ModelFormatError(folder, f"no model.safetensors, {INDEX_NAME} or *.safetensors file")
    return found, None


def load_model_folder(path: "str | os.PathLike[str]") -> ModelFolder:
    """Open a Hugging Face model folder; weights stay memory-mapped."""
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise ModelFormatError(folder, "not a directory")
    if folder.rstrip(os.sep).lower().endswith(".gguf") and not os.path.exists(os.path.join(folder, "config.json")):
        raise ModelFormatError(folder, "is a directory, not a GGUF file (and no model folder: no config.json)")
    config = read_json(os.path.join(folder, "config.json"))
    names, weight_map = _shard_files(folder)
    files, tensors, origin = [], {}, {}
    try:
        for name in names:
            f = load_safetensors(os.path.join(folder, name))
            files.append(f)
            for tname, t in f.tensors.items():
                if tname in tensors:
                    raise ModelFormatError(f.path, f"tensor {tname!r} is also in {origin[tname]}")
                tensors[tname], origin[tname] = t, name
        if weight_map is not None:
            for tname, shard in weight_map.items():
                if origin.get(tname) != shard:
                    raise ModelFormatError(os.path.join(folder, INDEX_NAME),
                                           f"tensor {tname!r} is listed in {shard!r} but "
                                           f"{'found in ' + repr(origin[tname]) if tname in origin else 'absent'}")
    except ModelFormatError:
        for f in files:
            f.close()
        raise
    tok_json = os.path.join(folder, "tokenizer.json")
    if os.path.exists(tok_json):
        require_regular(tok_json)  # the tokenizers library would block on a FIFO
    tokenizer_config = read_json(os.path.join(folder, "tokenizer_config.json"), required=False)
    return ModelFolder(
        path=folder, config=config, tensors=tensors, files=files,
        tokenizer_json=tok_json if os.path.exists(tok_json) else None,
        tokenizer_config=tokenizer_config,
        generation_config=read_json(os.path.join(folder, "generation_config.json"), required=False),
        chat_template=_chat_template(folder, tokenizer_config))
