"""Print the estimator's validation tables (docs/estimate.md) from tests/estimate_reference.toml.

python scripts/estimate_validation.py      # in-sample and leave-one-source-out tables, then the summary
python scripts/estimate_validation.py --by-kind   # the error bars by device family and layout kind only
python scripts/estimate_validation.py --write-docs   # replace the six tables in docs/estimate.md with these
(the error bars are the cross-validated errors, as the estimator prints them: torchtitan/estimate/accuracy.py)
"""

import re
import sys
from pathlib import Path

from torchtitan.estimate.accuracy import comparable, family, held_out_coverage
from torchtitan.estimate.validation import FITTED, cross_validated, load_reference, median_abs_error, table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "estimate.md"
IN_SAMPLE = "In-sample (every constant as shipped)"
CROSS_VALIDATED = "Cross-validated, leave one source out"
BY_KIND = "By device family and layout kind"
BY_SOURCE = "By source"
BY_QUANTITY = "By quantity"
HELD_OUT = "Error bars held out"
# the quantities of the reference rows (validation.table's `what`), as the by-source table names them
SHORT = {"tokens/s/device": "tokens/s", "TFLOPS/device": "TFLOPS", "memory GiB": "memory", "GPU-hours": "GPU-hours",
         "decode tokens/s": "decode", "step time s": "CPU step", "max RSS GiB": "CPU RSS"}  # fmt: skip
# the by-quantity table's lines: the goal's quantities (tokens/s and TFLOPS are one: the same step time)
QUANTITY_LINES = (("tokens/s and TFLOPS per device", ("tokens/s/device", "TFLOPS/device")),
                  ("GPU peak memory", ("memory GiB",)), ("GPU-hours", ("GPU-hours",)),
                  ("decode tokens/s", ("decode tokens/s",)), ("CPU step time", ("step time s",)),
                  ("CPU peak RSS", ("max RSS GiB",)))  # fmt: skip


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


def _within(rows: list[dict]) -> int:
    return sum(abs(x["error"]) <= x["goal"] for x in rows)


def summary(rows: list[dict]) -> str:
    return (
        f"{_within(rows)} of {len(rows)} figures within their goal; median absolute error"
        f" {median_abs_error(rows):.1%} (tokens/s, TFLOPS and step-time rows:"
        f" {median_abs_error([x for x in rows if x['goal'] == 0.15]):.1%})"
    )


def by_kind_table(rows: list[dict]) -> list[str]:
    """The error bars the estimator prints with an estimate (torchtitan/estimate/accuracy.py), for every device
    family and layout kind that has rows."""
    out = [
        "| quantity | family | layout kind | figures | estimate / published - 1 | 80 % interval | median | within goal |",
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: |",
    ]
    for what, fam, kind in sorted(
        {(x["what"], family(x["device"]), x["layout"]) for x in rows if "device" in x}
    ):
        a = comparable(rows, fam, kind, what)
        middle = f"{a['p10_error']:+.1%} .. {a['p90_error']:+.1%}" if "p10_error" in a else "-"
        out.append(
            f"| {what} | {fam} | {kind} | {a['figures']} | {a['min_error']:+.1%} .. {a['max_error']:+.1%} |"
            f" {middle} | {a['median_error']:+.1%} | {a['within_goal']} (±{a['goal']:.0%}) |"
        )
    return out


def held_out_table(rows: list[dict]) -> list[str]:
    """Per quantity: how often the range an estimate prints (the 80 % interval of its comparable rows' errors,
    accuracy.interval_80), made from the other sources' rows only, held a published figure
    (accuracy.held_out_coverage)."""
    out = [
        "| quantity | figures with a range | inside it | median width (high / low - 1) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for what, c in held_out_coverage(rows).items():
        out.append(
            f"| {what} | {c['figures']} | {c['inside']} ({c['inside'] / c['figures']:.0%}) | {c['median_width']:.1%} |"
        )
    return out


def _median(rows: list[dict]) -> str:
    return f"{median_abs_error(rows):.1%}"


def by_source_table(cv: list[dict], ins: list[dict]) -> list[str]:
    """One line per source of the reference file, in its order: the quantities, how many figures are within their
    goal and the median absolute error, cross-validated (the goal's errors) and in-sample."""
    out = [
        "| source | figures | within goal | median abs. error | in-sample | largest abs. error |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for source in load_reference()["sources"]:
        c = [x for x in cv if x["source"] == source]
        i = [x for x in ins if x["source"] == source]
        if not c:
            continue
        counts = {SHORT[w]: sum(x["what"] == w for x in c) for w in dict.fromkeys(x["what"] for x in c)}
        figures = ", ".join(f"{what} {n}" for what, n in counts.items())
        worst = max(c, key=lambda x: abs(x["error"]))["error"]
        out.append(
            f"| {source} | {figures} | {_within(c)} of {len(c)} | {_median(c)} | {_median(i)} | {worst:+.1%} |"
        )
    return out


def by_quantity_table(cv: list[dict], ins: list[dict]) -> list[str]:
    """One line per quantity and one for every figure: within goal, within 5 %, the median absolute error,
    cross-validated and in-sample."""
    out = [
        "| quantity | goal | within goal | within 5 % | median abs. error | in-sample |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    groups = [
        (name, [x for x in cv if x["what"] in whats], [x for x in ins if x["what"] in whats])
        for name, whats in QUANTITY_LINES
    ]
    groups.append(("every figure", cv, ins))
    for what, c, i in groups:
        if not c:
            continue
        goals = sorted({x["goal"] for x in c})
        goal = " / ".join(f"±{g:.0%}" for g in goals)
        within5 = sum(abs(x["error"]) <= 0.05 for x in c)
        out.append(
            f"| {what} | {goal} | {_within(c)} of {len(c)} | {within5} | {median_abs_error(c):.2%} |"
            f" {median_abs_error(i):.2%} |"
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
        text = replace_table(text, BY_QUANTITY, by_quantity_table(cv, ins))
        text = replace_table(text, BY_SOURCE, by_source_table(cv, ins))
        text = replace_table(text, HELD_OUT, held_out_table(cv))
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
    print(f"### {BY_QUANTITY}\n", *by_quantity_table(cv, ins), "", sep="\n")
    print(f"### {BY_SOURCE}\n", *by_source_table(cv, ins), "", sep="\n")
    print(f"### {HELD_OUT}\n", *held_out_table(cv), "", sep="\n")
    print_by_kind(cv)


if __name__ == "__main__":
    main()
