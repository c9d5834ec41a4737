"""tmp"""
from .errors import ModelFormatError
from .gguf import GGUFFile, GGUFTensor, GGUFTokenizerInfo, load_gguf
from .model_folder import ModelFolder, load_model_folder
from .safetensors import SafeTensor, SafetensorsFile, load_safetensors
