#!/usr/bin/env python
"""Convert a torchtitan llama3 or Llama 2 TOML config (its public release, Apr 2024, to its last TOML files, Feb 2026)
into this project's.

    python scripts/convert_torchtitan_config.py llama3_8b.toml                  # writes llama3_8b_converted.toml
    python scripts/convert_torchtitan_config.py debug_model.toml -o debug.toml --tokenizer-path tests/assets/tok

Prints one line per decision: kept (same name, same meaning), renamed / moved (another name or section here),
dropped (already our behaviour, or torchtitan's default of an option we do not have), unsupported (dropped, with
the nearest equivalent), default / shape (written so the run means what it meant in torchtitan: defaults that
differ, the debug flavor's shape, RoPE scaling by era, the vocabulary size taken from the tokenizer) and warning
(same name, other meaning). The decisions are also written as comments at the top of the output.
A value that cannot be expressed here: one line naming it, exit code 2, nothing written.
--era forces the era (2024, 2025, 2026) when the file's keys do not tell it right. --tokenizer-path replaces the
file's tokenizer (the debug flavor's vocabulary size is read from it). See docs/configuration.md.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.config import torchtitan_compat as compat  # noqa: E402
from torchtitan.config.manager import ConfigError, _load_toml  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="torchtitan TOML file")
    p.add_argument(
        "-o", "--output", default=None, help="output TOML (default: <name>_converted.toml beside it)"
    )
    p.add_argument("--era", choices=compat.ERAS, default=None, help="torchtitan era (default: from the keys)")
    p.add_argument(
        "--tokenizer-path", default=None, help="use this tokenizer (file or folder) instead of the file's"
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    a = p.parse_args(argv)
    out = a.output or compat.suggested_output(a.config)
    try:
        if Path(out).exists() and not a.force:
            raise UserError(f"{out} exists; pass --force to overwrite it or -o another file")
        toml = _load_toml(a.config)
        conv = compat.convert(toml, a.config, a.era, a.tokenizer_path)
        text = compat.to_toml(conv, a.config)
        for kind, line in conv.decisions:
            print(f"{kind:<11} {line}")
        tmp = Path(out).with_name(Path(out).name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out)  # all or nothing: a failed write leaves no half file
        print(
            f"wrote {out}: check it with  python -m torchtitan.preflight --job.config_file {out} --world_size N"
        )
        return 0
    except (UserError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"error: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
