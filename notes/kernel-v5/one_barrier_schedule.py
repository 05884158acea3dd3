"""The region schedule of v5-one-barrier.patch, walked for 1..11 tiles (python3 this_file.py).

Region t (between two barriers) runs phase 2 of tile t-2, the copy of tile t+1, the reduce of
tile t-1 and phase 1 of tile t. Each step's shared-memory reads and writes are listed by buffer
(ring slot t % 4; partial S, P and alpha by parity), and the walk checks that no buffer is written
in a region where anything else touches it, that every read finds the tile it wants as the
buffer's last write from an earlier region, that each tile passes phase 1, reduce and phase 2
once and in that order, and that each phase 2 gets its own tile's alpha and rescale vote.
"""

STAGES = 4


def region(t: int, n: int) -> list[tuple[str, str, str, int]]:
    """(step, "r" or "w", buffer, tile) of region t for n tiles."""
    acc = []
    if t >= 2:
        k = t - 2
        acc += [("phase2", "r", f"ring{k % STAGES}", k), ("phase2", "r", f"p{k % 2}", k),
                ("phase2", "r", f"alpha{k % 2}", k)]  # fmt: skip
    if t + 1 < n:  # the copy lands before region t+1's barrier (waited there)
        acc.append(("copy", "w", f"ring{(t + 1) % STAGES}", t + 1))
    if 1 <= t <= n:
        k = t - 1
        acc += [("reduce", "r", f"sp{k % 2}", k), ("reduce", "w", f"p{k % 2}", k),
                ("reduce", "w", f"alpha{k % 2}", k)]  # fmt: skip
    if t < n:
        acc += [("phase1", "r", f"ring{t % STAGES}", t), ("phase1", "w", f"sp{t % 2}", t)]
    return acc


def walk(n: int) -> None:
    holds = {"ring0": 0}  # buffer -> tile of its last write before the region (tile 0: prologue)
    order: dict[int, list[str]] = {k: [] for k in range(n)}
    votes: dict[int, int] = {}  # region -> tile whose reduce's vote its barrier carries
    last_reduce = None
    for t in range(n + 2):
        votes[t] = last_reduce
        acc = region(t, n)
        written = {b for _, rw, b, _ in acc if rw == "w"}
        for step, rw, buf, tile in acc:
            if rw == "r":
                assert buf not in written, f"region {t}: {buf} read and written"
                assert holds.get(buf) == tile, f"region {t}: {step} wants {tile} in {buf}"
            if step != "copy" and (not order[tile] or order[tile][-1] != step):
                order[tile].append(step)
            if step == "phase2" and buf.startswith("alpha"):
                assert votes[t] == tile, f"region {t}: phase 2 of {tile} votes {votes[t]}"
        for buf in written:
            assert sum(b == buf for _, rw, b, _ in acc if rw == "w") == 1, f"{buf} written twice"
        holds.update({b: k for _, rw, b, k in acc if rw == "w"})
        last_reduce = next((k for s, _, _, k in acc if s == "reduce"), None)
    assert all(steps == ["phase1", "reduce", "phase2"] for steps in order.values()), order


if __name__ == "__main__":
    for n in range(1, 12):
        walk(n)
    print("regions 0..n+1 for 1..11 tiles: no race, every read its own tile, votes paired")
