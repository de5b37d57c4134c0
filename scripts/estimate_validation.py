"""Print the estimator's validation table (docs/estimate.md) from tests/estimate_reference.toml.

python scripts/estimate_validation.py            # markdown table: row, quantity, published, estimated, error
"""

from torchtitan.estimate.validation import table


def main() -> None:
    print("| row | quantity | published | estimated | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    for x in table():
        fmt = ",.0f" if x["published"] >= 1000 else (".1f" if x["published"] >= 10 else ".2f")
        print(
            f"| {x['id']} | {x['what']} | {x['published']:{fmt}} | {x['estimated']:{fmt}} | {x['error']:+.1%} |"
        )


if __name__ == "__main__":
    main()
