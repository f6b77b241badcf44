#!/usr/bin/env python3
"""What the tensor-core attention kernels' tile loops are made of, read from their SASS.

  bench/attention_sass.py ARCH=SASS_FILE ... [--registers ARCH=TABLE ...] [--header OUT.h [--compiler "NVCC BUILD LINE"]]
      ARCH=SASS_FILE: the text of `cuobjdump -sass` of an object compiled for sm_ARCH
                (bench/ptxas_report.sh makes them: 90=, the H100's SASS, and 80=, the SASS an A100
                runs and, by binary compatibility, the sm_86/sm_89 GPUs: the CUDA build ships
                sm_80 and sm_90 code)
      --registers ARCH=TABLE: ptxas_report.sh's per-kernel table for that architecture (mangled
                name, then registers per thread, ...): the registers of the instantiations
                programs run, which the header records (the model works out from them how many
                blocks an SM holds); one for every ARCH, required with --header
      --header: also write the counts as the C++ table the performance model reads
                (model/attention_sass.h: make attention-sass writes it, make sass-check compares)
      --compiler: the compiler that made the SASS, recorded in the header (the counts are its)

Each kernel (attention_mma_{forward,dkv,dq}_kernel) has two tile bodies, one for interior tiles
(every row of the warp sees every key: no masks) and one with masks, chosen per tile. A loop with
two bodies is hard to read from SASS (nvcc may lay it out with two back edges, or merge the bodies'
common tails), so the counts come from single-body instantiations of each kernel (template
argument Path: 1 only the interior body, 2 only the masked one; bench/sass/attention_variants.cu),
which every instantiation programs run (Path 0) must have. In each it finds the tile loop (the
loop whose backward branch encloses the kernel's HMMA instructions: one 64-key tile per trip in
the forward, one 64 x 64 tile pair in the backward kernels), counts the instructions one warp
issues per trip by class, and prints them with instructions per HMMA and the issue ceiling: the
speed at which the four schedulers of every SM, issuing one instruction per clock each, would run
out of issue slots (H100 SXM: 132 SMs at 1.98 GHz), in the useful FLOPs kernels_bench counts
(4 * hd per causal score pair forward, 2.5 times that backward, the dK/dV and dQ kernels
together). The real kernels spend a few instructions more per tile choosing the body (the
forward at hd 64, counted both ways when the split landed: 421 / 544 in the kernel, 407 / 537
single-body).

Loops inside the tile loop must be known: the backward kernels' loop over the tile's four
chunks of 16 query rows (`for (c0 = 0; c0 < Bt; c0 += 16)` in kernels/attention_mma_backward.cuh)
runs INNER_TRIPS times per tile; any other inner loop (a copy loop the compiler did not unroll,
say) is an error naming its addresses, since its trip count would be a guess.
"""
import re
import sys
from collections import Counter, OrderedDict

SMS, CLOCK_HZ, ISSUE_PER_CLOCK = 132, 1.98e9, 4  # H100 SXM: SMs, boost clock, schedulers per SM
TILE = 64  # rows of a tile: the keys (queries) a trip walks


def warp_rows(kind):
    """The rows of its block's 64-row tile a warp owns: 32 in the forward, dK/dV (keys) and dQ with two
    row tiles a warp (2 warps; kernels/attention_mma_blocks.h attention_mma_row_tiles), else 16 (4
    warps)."""
    return 32 if kind.endswith("-32rows") else 16
INNER_TRIPS = {"dkv": TILE // 16, "dkv-32rows": TILE // 16, "dkv-swizzled": TILE // 16, "dq": TILE // 16,
               "dq-32rows": TILE // 16}
KINDS = ["forward", "forward-32rows", "dkv", "dkv-32rows", "dkv-swizzled", "dq", "dq-32rows"]

# Instruction classes, by the opcode's first component (HMMA.16816.F32.BF16 -> HMMA).
CLASSES = OrderedDict([
    ("HMMA", {"HMMA"}),
    ("LDSM", {"LDSM"}),
    ("LDGSTS", {"LDGSTS"}),
    ("ld/st", {"LDS", "STS", "LDG", "STG", "LD", "ST", "LDL", "STL", "RED", "ATOM", "ATOMS"}),
    ("fp32", {"FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "FCHK", "FSWZADD"}),
    ("MUFU", {"MUFU"}),
    ("int", {"IMAD", "IADD3", "IADD", "LEA", "SHF", "LOP3", "ISETP", "IMNMX", "VIADD", "VIMNMX", "SEL", "IABS",
             "POPC", "FLO", "BREV", "PRMT", "I2I", "IDP", "LOP", "SGXT", "BMSK", "ISCADD"}),
    ("convert", {"F2F", "F2FP", "I2F", "F2I", "F2IP", "I2FP"}),
    ("move", {"MOV", "S2R", "CS2R", "S2UR", "SHFL", "R2UR", "P2R", "R2P", "PLOP3", "VOTE", "VOTEU"}),
    ("branch", {"BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "JMP", "BREAK", "WARPSYNC"}),
    ("barrier", {"BAR", "DEPBAR", "LDGDEPBAR", "MEMBAR", "ERRBAR"}),
])


def instruction_class(opcode):
    base = opcode.split(".")[0]
    for name, members in CLASSES.items():
        if base in members:
            return name
    if base.startswith("U"):  # the uniform datapath (UMOV, UIADD3, ULDC, ...): integer work
        return "int"
    return "other"


def parse(text):
    """{mangled function name: [(address, opcode, text)]} in address order."""
    functions, current = OrderedDict(), None
    line_re = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = line_re.search(line)
        if m and current is not None:
            words = m.group(2).split()
            if words and words[0].startswith("@"):  # a predicate guard: @P0, @!PT
                words = words[1:]
            if words:
                current.append((int(m.group(1), 16), words[0], m.group(2)))
    return functions


def loops(code):
    """[(first, last)] address ranges closed by a backward branch."""
    found = []
    for address, opcode, text in code:
        if opcode.split(".")[0] == "BRA":
            m = re.search(r"0x([0-9a-f]+)", text)
            if m and int(m.group(1), 16) <= address:
                found.append((int(m.group(1), 16), address))
    return found


def within(code, first, last):
    return [i for i in code if first <= i[0] <= last]


def tile_loop_counts(name, code, inner_trips):
    """Instructions per class one warp issues per trip of the tile loop, inner loops expanded."""
    hmma_total = sum(1 for i in code if i[1].startswith("HMMA"))
    enclosing = [l for l in loops(code) if sum(1 for i in within(code, *l) if i[1].startswith("HMMA")) == hmma_total]
    if hmma_total == 0 or not enclosing:
        raise SystemExit(f"attention_sass: {name}: no loop encloses the kernel's {hmma_total} HMMA instructions")
    # The outermost, among those that also hold the most tile copies (LDGSTS): nvcc may give the loop
    # a second back edge that re-enters it past the copies (trips that prefetch nothing), and that
    # loop can span more addresses while its trips are not the ones that prefetch the next tile.
    copies = lambda l: sum(1 for i in within(code, *l) if i[1].startswith("LDGSTS"))
    tile = max(enclosing, key=lambda l: (copies(l), l[1] - l[0]))
    inner = [l for l in loops(code) if tile[0] <= l[0] and l[1] <= tile[1] and l != tile]
    if len(inner) > 1:
        raise SystemExit(f"attention_sass: {name}: {len(inner)} inner loops; this script expects at most one")
    trips = {}  # address: how many times a trip of the tile loop issues it
    for i in within(code, *tile):
        trips[i[0]] = 1
    for first, last in inner:
        body = within(code, first, last)
        if not any(i[1].startswith("HMMA") for i in body) or inner_trips is None:
            raise SystemExit(f"attention_sass: {name}: an inner loop at 0x{first:x}-0x{last:x} ({len(body)} "
                             f"instructions) whose trip count this script does not know: update INNER_TRIPS from "
                             f"the kernel's source, or unroll the loop")
        for i in body:
            trips[i[0]] = inner_trips
    c = Counter()
    for i in within(code, *tile):
        c[instruction_class(i[1])] += trips[i[0]]
    return c


def demangled_kind(name):
    """(kind, head dim, path) of a mangled attention kernel name, or None. The kind is 'forward',
    'forward-32rows' (the forward whose warps own two 16-row tiles: its fourth template argument, 2),
    'dkv', 'dkv-32rows' (its fifth template argument, 2), 'dkv-swizzled' (the dK/dV kernel with swizzled
    shared rows: its third template argument, AttentionMmaRows, 1), 'dq' or 'dq-32rows' (dQ's fourth
    template argument, 2). kSplit (the dK/dV kernel's fourth template argument, dQ's third:
    its tiles split into segments) changes the block's first and last steps, not its tile loop: both
    instantiations are one kind (the single-body variants are unsplit), whose registers are recorded
    for each."""
    named = split_kind(name)
    return named and named[:3]


def split_kind(name):
    """demangled_kind's (kind, head dim, path) and whether the instantiation splits (kSplit), or None."""
    m = re.match(r"_ZN2pv(?:\d+)attention_mma_(forward|dkv|dq)_kernelILi(\d+)ELi(\d)E"
                 r"(?:LNS_16AttentionMmaRowsE(\d)E)?(?:Lb([01])E)?(?:Li(\d)E)?E", name)
    if not m:
        return None
    kind = m.group(1) + ("-swizzled" if m.group(4) == "1" else "") + ("-32rows" if m.group(6) == "2" else "")
    return kind, int(m.group(2)), int(m.group(3)), m.group(5) == "1"


HEADER = """\
// Generated by bench/attention_sass.py from the sm_80 and sm_90 SASS of
// bench/sass/attention_variants.cu (the attention kernels with one tile body each; nvcc -O3 device
// code, as `make BACKEND=cuda` builds the kernels programs run, model/attention_kernels.cu, for
// both): `make attention-sass` rewrites this file, and `make sass-check` (CI) fails when the
// kernels' SASS no longer gives these figures. Do not edit.
// The counts are this compiler's (another nvcc may schedule the same source differently):
// nvcc: %s
//
// Per SASS architecture (90: what an H100 runs; 80: what an A100 runs, and by binary compatibility
// the sm_86/sm_89 GPUs, such as the RTX 4090, L40S and RTX 6000 Ada: the CUDA build ships sm_80 and
// sm_90 code), tensor-core attention kernel (attention_mma_{forward,dkv,dq}_kernel; "dkv-swizzled":
// the dK/dV kernel with swizzled shared rows) and head dim: the instructions one warp issues per
// trip of its tile loop (a 64-key tile of its 16 query rows in the forward, 32 in "forward-32rows",
// whose warps own two 16-row tiles; a 64 x 64 tile pair in the backward kernels, their loop over the
// tile's four 16-row chunks expanded, dK/dV's 16 keys of it, 32 in "dkv-32rows", dQ's 16 query rows,
// 32 in "dq-32rows") and the HMMA among
// them: through the body for tiles every row of the warp sees whole (interior), and through the
// one with masks (a diagonal or document-boundary tile), and the registers per thread of the
// instantiations programs run (ptxas), the one a block per tile and the one that splits a tile's
// steps into segments (kSplit: the same tile loop, registers that may differ, and with them the
// blocks an SM holds). model/step_cost.cpp turns them into time. A single-body
// instantiation that spills (make ptxas-report lists them) has its local loads and stores counted,
// which the kernel programs run may not have.
#pragma once

namespace pv {

struct AttentionTileSass {
    int sass_arch;       // 90 (sm_90) or 80 (sm_80)
    const char* kernel;  // "forward", "forward-32rows" (the forward, warps of 32 rows), "dkv",
                         // "dkv-32rows", "dkv-swizzled" (the dK/dV kernel, rows swizzled), "dq" or
                         // "dq-32rows"
    int head_dim;
    int instructions;         // per warp and tile-loop trip, an interior tile
    int masked_instructions;  // per warp and tile-loop trip, a tile with masks
    int hmma;
    int registers;        // per thread, the kernel programs run (ptxas)
    int split_registers;  // the same of its kSplit instantiation; 0 where there is none
};

// A line per architecture, kernel and head dim, as bench/attention_sass.py writes them: make
// sass-check compares this file with its output byte for byte, so clang-format leaves the table alone.
// clang-format off
inline constexpr AttentionTileSass kAttentionTileSass[] = {
%s
};
// clang-format on

}  // namespace pv
"""


def header_text(table, registers, compiler):
    order = sorted(table, key=lambda k: (-k[0], KINDS.index(k[1]), k[2]))
    rows = [f'    {{{arch}, "{kind}", {hd}, {sum(table[(arch, kind, hd)][0].values())}, '
            f'{sum(table[(arch, kind, hd)][1].values())}, {table[(arch, kind, hd)][0]["HMMA"]}, '
            f'{registers[(arch, kind, hd)].get(False, 0)}, {registers[(arch, kind, hd)].get(True, 0)}}},'
            for arch, kind, hd in order]
    return HEADER % (compiler, "\n".join(rows))


def read_registers(path, arch):
    """{(arch, kind, hd): {split: registers}} of the instantiations programs run (Path 0), unsplit and
    split (kSplit), from ptxas_report.sh's table; a kernel compiled in several sources counts at its
    most."""
    registers = {}
    for line in open(path):
        fields = line.split()
        kind = split_kind(fields[0]) if len(fields) > 1 else None
        if kind and kind[2] == 0:
            of_kind = registers.setdefault((arch,) + kind[:2], {})
            of_kind[kind[3]] = max(of_kind.get(kind[3], 0), int(fields[1]))
    return registers


def arch_and_path(arg, what):
    arch, sep, path = arg.partition("=")
    if not sep or not arch.isdigit() or not path:
        raise SystemExit(f"attention_sass: {what} '{arg}' is not ARCH=FILE (for example 90=k.sass)\n" + __doc__)
    return int(arch), path


def main():
    args, sass, tables, options = sys.argv[1:], {}, {}, {}
    while args:
        arg = args.pop(0)
        if arg in ("--registers", "--header", "--compiler"):
            if not args:
                raise SystemExit(f"attention_sass: {arg} needs a value\n" + __doc__)
            value = args.pop(0)
            if arg == "--registers":
                arch, path = arch_and_path(value, "--registers")
                tables[arch] = path
            else:
                options[arg] = value
        elif arg.startswith("--"):
            raise SystemExit(__doc__)
        else:
            arch, path = arch_and_path(arg, "SASS file")
            sass[arch] = path
    if not sass or ("--compiler" in options and "--header" not in options):
        raise SystemExit(__doc__)
    header, compiler = options.get("--header"), options.get("--compiler", "unknown")
    if header and set(tables) != set(sass):
        raise SystemExit(f"attention_sass: --header needs --registers for every architecture read "
                         f"({sorted(sass)}; given {sorted(tables)})\n" + __doc__)
    bodies, kernels = {}, set()  # (arch, kind, hd): {path: counts}; the (arch, kind, hd) programs run (path 0)
    for arch, path in sass.items():
        for name, code in parse(open(path).read()).items():
            kind = demangled_kind(name)
            if kind and kind[2] == 0:
                kernels.add((arch,) + kind[:2])
            elif kind:
                bodies.setdefault((arch,) + kind[:2], {})[kind[2]] = tile_loop_counts(
                    f"sm_{arch} {name}", code, INNER_TRIPS.get(kind[0]))
        if not any(k[0] == arch for k in kernels):
            raise SystemExit(f"attention_sass: no attention_mma kernel in {path}")
    missing = sorted(k for k in kernels if set(bodies.get(k, {})) != {1, 2})
    if missing:
        raise SystemExit(f"attention_sass: no single-body instantiations (Path 1 and 2) of {missing}: add them to "
                         f"bench/sass/attention_variants.cu")
    if len({tuple(sorted(k[1:] for k in kernels if k[0] == arch)) for arch in sass}) > 1:
        raise SystemExit("attention_sass: the architectures' SASS hold different kernels: compile the same sources")
    table = {k: (bodies[k][1], bodies[k][2]) for k in kernels}  # (interior, masked)
    for (arch, kind, hd), (interior, masked) in table.items():
        if interior["HMMA"] != masked["HMMA"]:
            raise SystemExit(f"attention_sass: sm_{arch} {kind} hd {hd}: the interior and masked bodies have "
                             f"{interior['HMMA']} and {masked['HMMA']} HMMA instructions: the same tile should "
                             f"take the same products")
    if header:
        registers = {}
        for arch, path in tables.items():
            registers.update(read_registers(path, arch))
        if set(registers) != kernels:
            raise SystemExit(f"attention_sass: the registers tables name {sorted(registers)}, the SASS {sorted(kernels)}")
        with open(header, "w") as out:
            out.write(header_text(table, registers, compiler))
    slots = SMS * ISSUE_PER_CLOCK * CLOCK_HZ  # warp instructions per second, the whole GPU
    columns = list(CLASSES) + ["other"]
    print("Tensor-core attention, per warp and tile-loop trip (the forward: 16 query rows x 64 keys, 32 in forward-32rows; "
          "dK/dV: 16 keys x 64 queries, 32 in dkv-32rows; dQ: 16 queries x 64 keys, 32 in dq-32rows), "
          "through the interior tiles' body and the "
          "masked tiles' (single-body instantiations); the issue ceiling is the interior tiles' on an H100 "
          "(sm_90 SASS):")
    print(f"{'sass':<6} {'kernel':<14} {'tile':<8} {'hd':>4} {'instr':>6} {'instr/HMMA':>10}  "
          + " ".join(f"{c:>7}" for c in columns) + "  issue ceiling")
    for arch in sorted(sass, reverse=True):
        for hd in sorted({hd for a, _, hd in table if a == arch}):
            for kind in KINDS:
                if (arch, kind, hd) not in table:
                    continue
                interior, masked = table[(arch, kind, hd)]
                for path, c in (("interior", interior), ("masked", masked)):
                    total = sum(c.values())
                    useful = warp_rows(kind) * TILE * (4 if kind.startswith("forward") else 10) * hd  # FLOPs of the warp's share
                    ceiling = ""
                    if path == "masked" or arch != 90:
                        pass
                    elif kind.startswith("forward"):
                        ceiling = f"{slots * useful / total / 1e12:6.0f} TF/s"
                    elif kind.startswith("dq") and (arch, "dkv", hd) in table:  # the backward: both kernels
                        # per 64 x 64 tile pair, dK/dV's warps (of 32 keys beside dQ's of 32 rows, where
                        # there are such) and dQ's
                        dkv = "dkv-32rows" if kind == "dq-32rows" and (arch, "dkv-32rows", hd) in table else "dkv"
                        pair = (TILE // warp_rows(dkv) * sum(table[(arch, dkv, hd)][0].values()) +
                                TILE // warp_rows(kind) * total)
                        ceiling = f"{slots * useful * TILE // warp_rows(kind) / pair / 1e12:6.0f} TF/s (dK/dV + dQ)"
                    print(f"sm_{arch:<3} {kind:<14} {path:<8} {hd:>4} {total:>6} "
                          f"{total / c['HMMA']:>10.2f}  " + " ".join(f"{c[col]:>7}" for col in columns) + "  " +
                          ceiling)


if __name__ == "__main__":
    main()
