"""tmp"""
from .errors import ModelFormatError
from .gguf import GGUFFile, GGUFTensor, GGUFTokenizerInfo, load_gguf
