"""Print the estimator's validation tables (docs/estimate.md) from tests/estimate_reference.toml.

python scripts/estimate_validation.py      # in-sample and leave-one-source-out tables, then the summary
"""

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


def main() -> None:
    ins = table()
    cv = cross_validated()
    _print(ins, "In-sample (every constant as shipped)")
    print(f"Constants fitted on reference rows (validation.FITTED): {FITTED or 'none'}\n")
    same = all(
        abs(a["estimated"] - b["estimated"]) <= 1e-9 * abs(a["estimated"])
        for a, b in zip(
            sorted(ins, key=lambda x: (x["id"], x["what"])), sorted(cv, key=lambda x: (x["id"], x["what"]))
        )
    )
    _print(cv, "Cross-validated, leave one source out" + (" (identical to in-sample)" if same else ""))


if __name__ == "__main__":
    main()
