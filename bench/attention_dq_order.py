#!/usr/bin/env python3
"""What a deterministic dQ inside the dK/dV pass would cost in waiting: a dispatch simulation.

  bench/attention_dq_order.py

FlashAttention-2 adds each key tile's share of dQ into fp32 with atomics, in whatever order the
blocks arrive; polevault's backward is deterministic (DESIGN.md section 4), so it recomputes S, P and
dP in a dQ kernel of its own. Fusing dQ into the dK/dV kernel deterministically means each query
tile's dQ receives the key tiles' shares in a fixed order, a block waiting until the share before
its own has landed (a per-query-tile counter, as FlashAttention-3's deterministic mode does). This
simulates the dK/dV grid (a block per key tile, KV head and batch; each block a step per query tile
from its diagonal on, every step the same cost) dispatched in launch order on 132 SMs holding
`blocks_per_sm` blocks each, and prints the grid's time, in steps, for:
  unordered   no waits (the atomics' schedule, or today's kernels): heaviest blocks first
  ascending   shares added in key-tile order 0, 1, ...: launch order heaviest first, so the block
              a share waits for was launched earlier (no deadlock under any number of slots)
  descending  shares added diagonal first: the block waited for must be launched earlier, so the
              grid goes lightest first
Two ways an SM shares its issue among its blocks: 'slot' (each block its 1/blocks_per_sm share,
waiting or not) and 'shared' (the SM's rate split among its blocks that are not waiting).
Steps are equal (interior tiles; the diagonal's masked body and the G query heads per block
scale every block alike). The fusion's instructions are docs/speed.md's arithmetic: about 0.77 of
the two kernels' per tile pair at hd 128; the net is 0.77 x (ordered / unordered).
"""
import sys


def simulate(chains, n, sms, per_sm, order, wait_for, model):
    blocks = order(chains, n)
    pending, done, t = 0, {}, 0.0
    sm = [[] for _ in range(sms)]  # resident blocks: [chain, key tile, query tile, work left]
    def fill():
        nonlocal pending
        for s in sm:
            while len(s) < per_sm and pending < len(blocks):
                p, j = blocks[pending]
                pending += 1
                s.append([p, j, j, 1.0])
    fill()
    while any(sm):
        rates = []
        for s in sm:
            waits = [wait_for(b[0], b[1], b[2]) for b in s]
            active = [b for b, w in zip(s, waits) if w is None or w in done]
            for b in active:
                rates.append((b, 1.0 if model == "slot" else per_sm / len(active)))
        if not rates:
            raise SystemExit("deadlock: every resident block waits")
        dt = min(b[3] / r for b, r in rates)
        t += dt
        for b, r in rates:
            b[3] -= r * dt
        for s in sm:
            for b in list(s):
                if b[3] <= 1e-9:
                    done[(b[0], b[1], b[2])] = t
                    b[2], b[3] = b[2] + 1, 1.0
                    if b[2] >= n:
                        s.remove(b)
        fill()
    return t


def heaviest_first(chains, n):
    return [(p, j) for j in range(n) for p in range(chains)]


def lightest_first(chains, n):
    return [(p, j) for j in reversed(range(n)) for p in range(chains)]


def no_wait(p, j, i):
    return None


def ascending(p, j, i):
    return (p, j - 1, i) if j > 0 else None


def descending(p, j, i):
    return (p, j + 1, i) if j + 1 <= i else None


def main():
    shapes = [  # name, chains (batch x KV heads), key tiles, blocks per SM
        ("Llama-3.2-1B, 4 x 2048, hd 64", 4 * 8, 2048 // 64, 3),
        ("Llama-3.1-8B, 6 x 2048, hd 128", 6 * 8, 2048 // 64, 2),
        ("Llama-3.2-1B, 1 x 8192, hd 64", 1 * 8, 8192 // 64, 3),
        ("Llama-3.1-8B, 1 x 8192, hd 128", 1 * 8, 8192 // 64, 2),
    ]
    print("| shape | SM sharing | unordered (steps) | ascending | descending | net of the fusion (0.77 x best ordered / unordered) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, chains, n, per_sm in shapes:
        for model in ("slot", "shared"):
            u = simulate(chains, n, 132, per_sm, heaviest_first, no_wait, model)
            a = simulate(chains, n, 132, per_sm, heaviest_first, ascending, model)
            d = simulate(chains, n, 132, per_sm, lightest_first, descending, model)
            print(f"| {name} | {model} | {u:.0f} | {a:.0f} ({a / u:.2f}x) | {d:.0f} ({d / u:.2f}x) | "
                  f"{0.77 * min(a, d) / u:.2f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
