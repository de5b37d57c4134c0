"""Print the estimator's validation tables (docs/estimate.md) from tests/estimate_reference.toml.

python scripts/estimate_validation.py      # in-sample and leave-one-source-out tables, then the summary
python scripts/estimate_validation.py --by-kind   # the error bars by device family and layout kind only
(the error bars are the cross-validated errors, as the estimator prints them: torchtitan/estimate/accuracy.py)
"""

import sys

from torchtitan.estimate.accuracy import comparable, family
from torchtitan.estimate.validation import FITTED, cross_validated, median_abs_error, table


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def _print(rows: list[dict], title: str) -> None:
    print(f"### {title}\n")
    print("| row | source | quantity | published | estimated | error | goal |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for x in rows:
        ok = "yes" if abs(x["error"]) <= x["goal"] else "**no**"
        print(
            f"| {x['id']} | {x['source']} | {x['what']} | {_fmt(x['published'])} | {_fmt(x['estimated'])} |"
            f" {x['error']:+.1%} | {ok} (±{x['goal']:.0%}) |"
        )
    within = sum(abs(x["error"]) <= x["goal"] for x in rows)
    print(
        f"\n{within} of {len(rows)} figures within their goal; median absolute error"
        f" {median_abs_error(rows):.1%} (tokens/s, TFLOPS and step-time rows:"
        f" {median_abs_error([x for x in rows if x['goal'] == 0.15]):.1%})\n"
    )


def print_by_kind(rows: list[dict]) -> None:
    """The error bars the estimator prints with an estimate (torchtitan/estimate/accuracy.py), for every device
    family and layout kind that has rows."""
    print("### By device family and layout kind\n")
    print("| quantity | family | layout kind | figures | estimate / published - 1 | median | within goal |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    keys = sorted({(x["what"], family(x["device"]), x["layout"]) for x in rows if "device" in x})
    for what, fam, kind in keys:
        a = comparable(rows, fam, kind, what)
        print(
            f"| {what} | {fam} | {kind} | {a['figures']} | {a['min_error']:+.1%} .. {a['max_error']:+.1%} |"
            f" {a['median_error']:+.1%} | {a['within_goal']} (±{a['goal']:.0%}) |"
        )
    print()


def main() -> None:
    cv = cross_validated()
    if "--by-kind" in sys.argv[1:]:
        print_by_kind(cv)
        return
    ins = table()
    _print(ins, "In-sample (every constant as shipped)")
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
    _print(cv, "Cross-validated, leave one source out" + (" (identical to in-sample)" if same else ""))
    print_by_kind(cv)


if __name__ == "__main__":
    main()
