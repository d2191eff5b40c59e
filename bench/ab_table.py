"""The table of a `gpu_check.sh ab` log: each program's timings per row, and its means against base.

  python3 bench/ab_table.py ab.log [base]

ab.log lines read "NAME ROUND: gdn-cuda B=1 T=65536 HK=16 HV=32: fwd 2.039 ms(...) | fwd+bwd 7.863
ms(...)". Prints a markdown table (a program a line, a row of the benchmark a column, "forward
runs / forward + backward runs" in ms), then each program's change of the means against the base
program (`base` unless named), in %, so that RESULTS.md gets the figures as run.
"""
import collections
import re
import sys

line_re = re.compile(r"^(\S+) \d+: gdn-cuda (.*?): fwd ([0-9.]+) ms.*\| fwd\+bwd ([0-9.]+) ms")


def shape(text):
    """A column name: the shape without the parts every row shares."""
    text = text.replace(" HK=16 HV=32", "")
    return text.replace("B=1 ", "") if text.startswith("B=1 ") else text


def mean(xs):
    return sum(xs) / len(xs)


def main():
    path = sys.argv[1]
    base = sys.argv[2] if len(sys.argv) > 2 else "base"
    runs = collections.OrderedDict()  # program -> row -> ([fwd], [fwd+bwd])
    rows = []
    with open(path) as log:
        for line in log:
            match = line_re.match(line.strip())
            if not match:
                continue
            program, row = match.group(1), shape(match.group(2))
            if row not in rows:
                rows.append(row)
            fwd, both = runs.setdefault(program, {}).setdefault(row, ([], []))
            fwd.append(float(match.group(3)))
            both.append(float(match.group(4)))
    if not runs:
        sys.exit(f"ab_table: no timing lines in {path}")

    def cell(times):
        return ", ".join(f"{t:.3f}" for t in times)

    print("| program | " + " | ".join(rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for program, by_row in runs.items():
        cells = [f"{cell(by_row[r][0])} / {cell(by_row[r][1])}" if r in by_row else "" for r in rows]
        print(f"| {program} | " + " | ".join(cells) + " |")
    if base not in runs:
        return
    print()
    for program, by_row in runs.items():
        if program == base:
            continue
        changes = []
        for r in rows:
            if r in by_row and r in runs[base]:
                f = 100 * (mean(by_row[r][0]) / mean(runs[base][r][0]) - 1)
                b = 100 * (mean(by_row[r][1]) / mean(runs[base][r][1]) - 1)
                changes.append(f"{r} {f:+.1f}% / {b:+.1f}%")
        print(f"{program} against {base} (means, forward / forward + backward): " + "; ".join(changes))


if __name__ == "__main__":
    main()
