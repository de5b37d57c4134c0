"""Low-precision training: float8 linear layers through torchao (float8.py)."""
