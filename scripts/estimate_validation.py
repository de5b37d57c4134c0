"""Print the estimator's validation tables (docs/estimate.md) from tests/estimate_reference.toml.

python scripts/estimate_validation.py      # in-sample and leave-one-source-out tables, then the summary
python scripts/estimate_validation.py --by-kind   # the error bars by device family and layout kind only
python scripts/estimate_validation.py --write-docs   # replace the three tables in docs/estimate.md with these
(the error bars are the cross-validated errors, as the estimator prints them: torchtitan/estimate/accuracy.py)
"""

import re
import sys
from pathlib import Path

from torchtitan.estimate.accuracy import comparable, family
from torchtitan.estimate.validation import FITTED, cross_validated, median_abs_error, table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "estimate.md"
IN_SAMPLE = "In-sample (every constant as shipped)"
CROSS_VALIDATED = "Cross-validated, leave one source out"
BY_KIND = "By device family and layout kind"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def rows_table(rows: list[dict]) -> list[str]:
    """The markdown table of every figure: published, estimated, error, within its goal or not."""
    out = [
        "| row | source | quantity | published | estimated | error | goal |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for x in rows:
        ok = "yes" if abs(x["error"]) <= x["goal"] else "**no**"
        out.append(
            f"| {x['id']} | {x['source']} | {x['what']} | {_fmt(x['published'])} | {_fmt(x['estimated'])} |"
            f" {x['error']:+.1%} | {ok} (±{x['goal']:.0%}) |"
        )
    return out


def summary(rows: list[dict]) -> str:
    within = sum(abs(x["error"]) <= x["goal"] for x in rows)
    return (
        f"{within} of {len(rows)} figures within their goal; median absolute error"
        f" {median_abs_error(rows):.1%} (tokens/s, TFLOPS and step-time rows:"
        f" {median_abs_error([x for x in rows if x['goal'] == 0.15]):.1%})"
    )


def by_kind_table(rows: list[dict]) -> list[str]:
    """The error bars the estimator prints with an estimate (torchtitan/estimate/accuracy.py), for every device
    family and layout kind that has rows."""
    out = [
        "| quantity | family | layout kind | figures | estimate / published - 1 | median | within goal |",
        "| --- | --- | --- | ---: | --- | ---: | ---: |",
    ]
    for what, fam, kind in sorted(
        {(x["what"], family(x["device"]), x["layout"]) for x in rows if "device" in x}
    ):
        a = comparable(rows, fam, kind, what)
        out.append(
            f"| {what} | {fam} | {kind} | {a['figures']} | {a['min_error']:+.1%} .. {a['max_error']:+.1%} |"
            f" {a['median_error']:+.1%} | {a['within_goal']} (±{a['goal']:.0%}) |"
        )
    return out


def print_by_kind(rows: list[dict]) -> None:
    print(f"### {BY_KIND}\n", *by_kind_table(rows), "", sep="\n")


def _fail(what: str) -> None:
    """One line naming the file and what is missing in it, exit 2 (the project's bad-input convention)."""
    sys.stderr.write(f"error: {DOCS}: {what}\n")
    sys.exit(2)


def replace_table(text: str, title: str, lines: list[str], new_summary: str | None = None) -> str:
    """`text` (docs/estimate.md) with the table under the heading `#### title` replaced by `lines`, and the summary
    line that follows it by `new_summary`."""
    heading = re.search(rf"^#### {re.escape(title)}\n\n", text, re.M)
    if heading is None:
        _fail(f"no '#### {title}' section")
    table_re = re.compile(r"(?:\|.*\n)+")
    old = table_re.match(text, heading.end())
    if old is None:
        _fail(f"the '#### {title}' section does not start with a table")
    text = text[: old.start()] + "\n".join(lines) + "\n" + text[old.end() :]
    if new_summary is not None:  # the first summary line after the table (table lines start with "|")
        line = re.compile(r"^\d+ of \d+ figures within their goal;.*$", re.M).search(text, old.start())
        if line is None:
            _fail(f"no summary line after the '#### {title}' table")
        text = text[: line.start()] + new_summary + text[line.end() :]
    return text


def main() -> None:
    cv = cross_validated()
    if "--by-kind" in sys.argv[1:]:
        print_by_kind(cv)
        return
    ins = table()
    if "--write-docs" in sys.argv[1:]:
        text = DOCS.read_text()
        text = replace_table(text, IN_SAMPLE, rows_table(ins), summary(ins))
        text = replace_table(text, CROSS_VALIDATED, rows_table(cv), summary(cv))
        DOCS.write_text(replace_table(text, BY_KIND, by_kind_table(cv)))
        print(f"{DOCS}: tables rewritten; in-sample {summary(ins)}; cross-validated {summary(cv)}")
        return
    print(f"### {IN_SAMPLE}\n", *rows_table(ins), "", summary(ins), "", sep="\n")
    fitted = "; ".join(
        f"{name} (on the {', '.join(f.quantities)} rows, tried {f.grid[0]:g} .. {f.grid[-1]:g})"
        for name, f in FITTED.items()
    )
    print(f"Constants fitted on reference rows (validation.FITTED): {fitted or 'none'}\n")
    same = all(
        abs(a["estimated"] - b["estimated"]) <= 1e-9 * abs(a["estimated"])
        for a, b in zip(
            sorted(ins, key=lambda x: (x["id"], x["what"])), sorted(cv, key=lambda x: (x["id"], x["what"]))
        )
    )
    title = CROSS_VALIDATED + (" (identical to in-sample)" if same else "")
    print(f"### {title}\n", *rows_table(cv), "", summary(cv), "", sep="\n")
    print_by_kind(cv)


if __name__ == "__main__":
    main()
