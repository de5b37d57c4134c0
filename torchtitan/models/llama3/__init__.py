"""Llama 3 (3.1 / 3.2 shapes): model args, flavors and the Transformer."""

from torchtitan.models.llama3.args import ModelArgs, RopeScaling, get_model_args, llama3_flavors
from torchtitan.models.llama3.model import Transformer, normalize_fqn

__all__ = ["ModelArgs", "RopeScaling", "Transformer", "get_model_args", "llama3_flavors", "normalize_fqn"]
