"""Reads `nvdisasm -g -c` output (SASS with source lines) and prints, per kernel, its static
instruction counts: for each setmaxnreg region (a role of a warp-specialized kernel, or the whole
kernel) the instructions, spills (STL, LDL), tensor-core and barrier instructions, and the source
lines that hold most instructions and every spill; then its largest loops (a backward branch to
a label: the instructions between, those of a chunk or value-head loop a warp issues each turn),
each with its chain gaps: the instructions from each wgmma wait to the next wgmma (the last one's
to the next turn's first), the element-wise work that sits on a pass's chain between products,
and its chain spans: from each wait to the next product's last wgmma (the one closing its group,
`gsb0`), since ptxas may spread a product's wgmma over the work that follows its first, and the
product completes only after its last is issued.
Static: a loop body counts once, and each role's copy of shared code (both sides of a branch on
the thread's index) counts in full.

    python3 bench/sass_lines.py FILE.sass [KERNEL_SUBSTRING] [--top N]
"""

import argparse
import collections
import re
import signal
import subprocess

FUNCTION = re.compile(r"^//-+ \.text\.(\S+) -+")
SOURCE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
LABEL = re.compile(r"^\.L_x_(\d+):")
TARGET = re.compile(r"\.L_x_(\d+)")
KINDS = ("STL", "LDL", "HGMMA", "BAR", "LDGSTS", "LDSM", "STSM", "LDS", "STS", "LDG", "STG")


class Region:
    def __init__(self, name):
        self.name = name
        self.kinds = collections.Counter()
        self.lines = collections.Counter()
        self.spills = collections.Counter()


class Kernel:
    def __init__(self):
        self.regions = [Region("start")]
        self.ops = []  # every instruction's opcode, in order
        self.labels = {}  # label -> index of the instruction after it
        self.back = []  # (index of a branch, its label)
        self.waits = []  # indices of the wgmma waits (WARPGROUP.DEPBAR)
        self.closing = set()  # indices of the wgmma that close a group (gsb0)

    def gaps(self, first, last, closing=False):
        """Instructions from each wgmma wait in the loop [first, last] to the next wgmma (with
        `closing`, to the next one closing a group), the last one's around the back edge."""
        body = range(first, last + 1)
        marks = [i for i in body if (i in self.closing if closing else self.ops[i] == "HGMMA")]
        if not marks:
            return []
        out = []
        for wait in (w for w in self.waits if first <= w <= last):
            later = [i for i in marks if i > wait]  # else the next turn's, past the back edge
            out.append(later[0] - wait - 1 if later else last - wait + marks[0] - first)
        return out

    def loops(self):
        """(instructions, spill instructions, wgmma, region, chain gaps, chain spans) of each
        loop, largest first."""
        starts = [i for i, op in enumerate(self.ops) if op == "USETMAXREG"]
        out = []
        for at, label in self.back:
            first = self.labels.get(label, at + 1)
            if first > at:
                continue
            region = sum(1 for i in starts if i <= first)
            if region != sum(1 for i in starts if i <= at):
                continue  # a jump between roles' code, not a loop of one
            body = self.ops[first : at + 1]
            spills = sum(op in ("STL", "LDL") for op in body)
            out.append((len(body), spills, body.count("HGMMA"), self.regions[region].name,
                        self.gaps(first, at), self.gaps(first, at, closing=True)))
        return sorted(out, reverse=True)


def parse(path, want):
    """{kernel: Kernel}, its regions split at each USETMAXREG."""
    kernels, kernel, source = {}, None, "?"
    for text in open(path):
        match = FUNCTION.match(text)
        if match:
            name = match.group(1)
            kernel = kernels.setdefault(name, Kernel()) if want in name else None
            continue
        if kernel is None:
            continue
        match = SOURCE.search(text)
        if match:
            source = f"{match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}"
            continue
        match = LABEL.match(text.strip())
        if match:
            kernel.labels[match.group(1)] = len(kernel.ops)
            continue
        match = INSTRUCTION.match(text)
        if not match:
            continue
        op = match.group(1)
        if op == "BRA":
            target = TARGET.search(text)
            if target and target.group(1) in kernel.labels:  # a label above: a loop
                kernel.back.append((len(kernel.ops), target.group(1)))
        if "WARPGROUP.DEPBAR" in text:
            kernel.waits.append(len(kernel.ops))
        if op == "HGMMA" and "gsb0" in text:
            kernel.closing.add(len(kernel.ops))
        kernel.ops.append(op)
        regions = kernel.regions
        if op == "USETMAXREG":
            regions.append(Region(text.split(";")[0].split()[-1] + " registers"))
        region = regions[-1]
        region.kinds["all"] += 1
        if op in KINDS:
            region.kinds[op] += 1
        region.lines[source] += 1
        if op in ("STL", "LDL"):
            region.spills[(op, source)] += 1
    return kernels


def readable(mangled):
    name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    name = re.sub(r"gdn::cuda::\(anonymous namespace\)::|^void |\(gdn::cuda::Params\)$", "", name)
    return name.replace("__nv_bfloat16", "bf16").replace("__half", "f16")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    parser = argparse.ArgumentParser()
    parser.add_argument("sass")
    parser.add_argument("kernel", nargs="?", default="")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for name, kernel in parse(args.sass, args.kernel).items():
        regions = kernel.regions
        total = sum(r.kinds["all"] for r in regions)
        print(f"{readable(name)}: {total} instructions")
        for region in regions:
            if not region.kinds["all"]:
                continue
            counts = ", ".join(f"{k} {region.kinds[k]}" for k in KINDS if region.kinds[k])
            print(f"  {region.name}: {region.kinds['all']} ({counts})")
            lines = ", ".join(f"{s} {n}" for s, n in region.lines.most_common(args.top))
            print(f"    most: {lines}")
            if region.spills:
                spills = ", ".join(f"{op} {s} {n}" for (op, s), n in region.spills.most_common(args.top))
                print(f"    spills ({sum(region.spills.values())}): {spills}")
        for size, spills, wgmma, where, gaps, spans in kernel.loops()[:4]:
            chain = (f"; chain gaps {', '.join(map(str, gaps))}; spans {', '.join(map(str, spans))}"
                     if gaps else "")
            print(f"  loop of {size} instructions ({spills} spill, {wgmma} wgmma) in {where}"
                  + chain)


if __name__ == "__main__":
    main()
