"""Loading models from disk: GGUF files, safetensors files, Hugging Face folders, tokenizers.

Weights are memory-mapped and never copied unless asked for: quantized GGUF tensors
stay as raw block bytes (decode them with ``lightspeed.quant``, in numpy or in a graph).

GGUF (``gguf.py``)::

    gf = load_gguf(path)                  # GGUFFile
    gf.architecture, gf.metadata          # "llama", {"llama.block_count": 30, ...}
    gf.arch("embedding_length")           # metadata["<arch>.embedding_length"], ModelFormatError if absent
    t = gf.tensors["blk.0.attn_q.weight"] # GGUFTensor
    t.shape, t.qtype                      # numpy order (out_features, in_features), QType.Q4_1
    t.raw                                 # uint8 (rows, row_bytes) view of the file
    t.dequantize()                        # float32 array of t.shape
    gf.tokenizer_info(), gf.chat_template

safetensors (``safetensors.py``) and model folders (``model_folder.py``)::

    st = load_safetensors(path)           # SafetensorsFile: .tensors[name] -> SafeTensor, .metadata
    st.tensors[name].numpy()              # mapped view; BF16 as uint16 bits (ls.bfloat16)
    mf = load_model_folder(folder)        # config.json, tokenizer files, (sharded) weights
    mf.config, mf.tensors, mf.chat_template, mf.special_tokens

Tokenizers (``tokenizer.py``)::

    tok = Tokenizer.from_gguf(path_or_gguf_file)   # or Tokenizer.from_folder(folder)
    tok.encode(text, add_special_tokens=True), tok.decode(ids), tok.stream().push(id)
    tok.apply_chat_template(messages, add_generation_prompt=True)   # bounded (TemplateLimits, limits=...)
    tok.encode_chat(messages, add_generation_prompt=True)           # ids; special tokens in messages stay text
    tok.bos_id, tok.eos_id, tok.stop_ids

Every loader raises ``ModelFormatError`` (a ValueError carrying ``.path`` and
``.problem``) for a malformed, truncated or inconsistent file, or one that is not a
regular file; ``plausibility`` checks model metadata before anything is built from it.
"""
from .chat_template import render_chat
from .errors import ChatTemplateError, ChatTemplateLimitError, ModelFormatError
from .gguf import GGUFFile, GGUFTensor, GGUFTokenizerInfo, load_gguf
from .model_folder import ModelFolder, load_model_folder
from .safetensors import SafeTensor, SafetensorsFile, load_safetensors
from .template_limits import TemplateLimits
from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["ModelFormatError", "load_gguf", "GGUFFile", "GGUFTensor", "GGUFTokenizerInfo", "load_safetensors",
           "SafetensorsFile", "SafeTensor", "load_model_folder", "ModelFolder", "Tokenizer", "StreamDecoder",
           "render_chat", "ChatTemplateError", "ChatTemplateLimitError", "TemplateLimits"]
