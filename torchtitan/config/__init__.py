from .job_config import JobConfig
from .manager import ConfigError, help_text, parse_args, to_dict, to_toml, validate

__all__ = ["JobConfig", "ConfigError", "help_text", "parse_args", "to_dict", "to_toml", "validate"]
