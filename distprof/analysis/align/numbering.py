"""Which instance of its process group's collective sequence each rank's collective is, the ranks made to agree.

Matching (:mod:`.matching`) takes the k-th collective of a group, per window, on every rank as one instance. Two
numberings give that k:

* **torch's own** (``nccl_seq``, the ``Seq`` of ``record_param_comms``: ProcessGroupNCCL counts every collective
  of a group from its creation, the same count on every member). Used for a group and window where every rank's
  every collective carries one, once per rank.
* **the start order on each rank** (the shard's ``seq``), else. gloo records no sequence number. The start order is
  not always the same on every rank: gloo runs a group's queued collectives on two worker threads, so two
  collectives launched back to back (two DDP buckets) start in either order; a collective in flight at a window's
  edge is recorded on some ranks only. Taken as it is, the k-th collective of one rank is then paired with another
  collective of its peer (``all_reduce of 672768 B on rank 0; all_reduce of 112 B on rank 1``), and the lateness
  and waits measured on that pair are wrong.

So, where a rank's start order disagrees with the reference rank's (the lowest rank of the group in the window) on
the op or size of a collective both hold, the two sequences are aligned (:func:`align_sequences`). Both are walked
in order; where they disagree, repairs of growing size s = 1, 2, … up to :data:`MAX_REPAIR` are tried, and the first
after which the sequences agree again (the next :data:`LOOKAHEAD` collectives, or all that is left of both) is
taken:

* s + 1 collectives holding the same ops and sizes in another order: paired op and size alike, in order (the next
  :data:`REORDER_LOOKAHEAD` must agree);
* s collectives only this rank recorded, or only the reference did — only where that side holds more collectives
  of those ops and sizes than the other over the whole group and window;
* at s = 1, one pair that differs: a real disagreement, paired as it is, which matching reports.

Nothing fitting: the pair is taken as a disagreement. A collective only some ranks recorded becomes an instance of
its own (reported as missing on the others; the same extra collective on several ranks is one instance). Sizes are
not compared for ops whose sizes differ across ranks by design (``VARIABLE_SIZE_OPS``), nor where unknown (−1).

Cost: one vectorised comparison per (group, window, rank); the walk runs only for ranks that disagree, in Python,
O(collectives + repairs × MAX_REPAIR²).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Table = dict[str, np.ndarray]

#: Collectives that must agree after a repair for it to be taken (fewer where a sequence ends): after collectives
#: only one side recorded, or one pair that differs; after a run of the same ops and sizes in another order.
LOOKAHEAD = 4
REORDER_LOOKAHEAD = 2
#: Largest run a repair may reorder, skip or add, in collectives.
MAX_REPAIR = 8


@dataclass
class Numbering:
    """Instance numbers (``key``, per numbered row given) and how they were found."""

    key: np.ndarray  # int64: the instance's number in its (pg, window); −1 for rows not numbered
    torch_groups: int = 0  # (pg, window) groups numbered by torch's sequence numbers
    realigned: list[tuple[int, int, int]] = field(default_factory=list)  # (pg, window, rank) whose order was repaired


@dataclass
class RankOrder:
    """One rank's collectives of one group and window, in its order: seq values, op, size as compared, exact code."""

    rows: np.ndarray  # indices into the caller's arrays
    seq: np.ndarray
    op: np.ndarray
    size: np.ndarray  # −1: not compared
    code: np.ndarray | None = None  # one integer per distinct (op, size) of the group (given where it is walked)


def _compatible(op_a, size_a, op_b, size_b) -> np.ndarray:
    return (op_a == op_b) & ((size_a == size_b) | (size_a < 0) | (size_b < 0))


def _agrees(ref: RankOrder, mine: RankOrder, i: int, j: int, n: int = LOOKAHEAD) -> bool:
    """Whether the sequences agree from ref[i] and mine[j] on: the next `n` collectives, or, nearer their ends, all
    that is left of both, as long on each."""
    left_a, left_b = len(ref.seq) - i, len(mine.seq) - j
    k = min(n, left_a, left_b)
    if k < n and left_a != left_b:
        return False
    return k == 0 or bool(_compatible(ref.op[i:i + k], ref.size[i:i + k], mine.op[j:j + k],
                                      mine.size[j:j + k]).all())


def _run_length(ref: RankOrder, mine: RankOrder, i: int, j: int) -> int:
    """How many collectives from ref[i] and mine[j] agree, in a row."""
    n = min(len(ref.seq) - i, len(mine.seq) - j)
    if n <= 0:
        return 0
    ok = _compatible(ref.op[i:i + n], ref.size[i:i + n], mine.op[j:j + n], mine.size[j:j + n])
    return n if ok.all() else int(np.argmin(ok))


def _reordered(ref: RankOrder, mine: RankOrder, i: int, j: int, k: int) -> list[tuple[int, int]] | None:
    """Pairs (ref index, own index) when ref[i:i+k] and mine[j:j+k] hold the same (op, size) in another order and
    the next REORDER_LOOKAHEAD collectives agree; None otherwise."""
    if i + k > len(ref.seq) or j + k > len(mine.seq):
        return None
    a, b = ref.code[i:i + k], mine.code[j:j + k]
    if not np.array_equal(np.sort(a), np.sort(b)) or not _agrees(ref, mine, i + k, j + k, REORDER_LOOKAHEAD):
        return None
    oa, ob = np.argsort(a, kind="stable"), np.argsort(b, kind="stable")  # the n-th of a code pairs with the n-th
    return [(i + int(x), j + int(y)) for x, y in zip(oa, ob)]


def _take(surplus: dict[int, int], codes: np.ndarray, sign: int) -> bool:
    """Whether `codes` can be collectives one side recorded and the other did not: each is in surplus on that side
    (sign +1: this rank, −1: the reference) as often; if so, counted off."""
    need: dict[int, int] = {}
    for c in codes.tolist():
        need[c] = need.get(c, 0) + 1
    if any(sign * surplus.get(c, 0) < k for c, k in need.items()):
        return False
    for c, k in need.items():
        surplus[c] -= sign * k
    return True


def _repair(ref: RankOrder, mine: RankOrder, i: int, j: int,
            surplus: dict[int, int]) -> tuple[list[tuple[int, int]], int, int]:
    """Where ref[i] and mine[j] disagree: the pairs the first fitting repair makes (see the module docstring) and
    how far each sequence moves on. Tried by size s = 1, 2, ...: s + 1 collectives in another order; s only on
    this rank, or only on the reference, where that side recorded more of those ops and sizes (`surplus`: per
    code, this rank's count minus the reference's, still unexplained); at s = 1, one pair that differs."""
    n, m = len(ref.seq), len(mine.seq)
    for s in range(1, MAX_REPAIR + 1):
        pairs = _reordered(ref, mine, i, j, s + 1)
        if pairs is not None:
            return pairs, s + 1, s + 1
        if j + s <= m and _agrees(ref, mine, i, j + s) and _take(surplus, mine.code[j:j + s], 1):
            return [], 0, s  # mine[j:j+s] only on this rank
        if i + s <= n and _agrees(ref, mine, i + s, j) and _take(surplus, ref.code[i:i + s], -1):
            return [], s, 0  # ref[i:i+s] not on this rank
        if s == 1 and _agrees(ref, mine, i + 1, j + 1):
            break
    return [(i, j)], 1, 1  # a real disagreement: paired as it is


def _surplus(ref: RankOrder, mine: RankOrder) -> dict[int, int]:
    codes = np.concatenate([mine.code, ref.code])
    weights = np.r_[np.ones(mine.code.size, np.int64), -np.ones(ref.code.size, np.int64)]
    u, inv = np.unique(codes, return_inverse=True)
    total = np.bincount(inv.reshape(-1), weights=weights, minlength=u.size)
    return {int(c): int(t) for c, t in zip(u.tolist(), total.tolist()) if t}


def align_sequences(ref: RankOrder, mine: RankOrder) -> np.ndarray:
    """For each of `mine`'s collectives, the index in `ref` it is paired with, or −(1 + p) for one only this rank
    recorded, p being the number of `ref` collectives before it (both sequences with their codes: `_with_codes`)."""
    out = np.empty(len(mine.seq), np.int64)
    surplus = _surplus(ref, mine)
    i = j = 0
    n, m = len(ref.seq), len(mine.seq)
    while i < n and j < m:
        run = _run_length(ref, mine, i, j)
        out[j:j + run] = np.arange(i, i + run)
        i, j = i + run, j + run
        if i >= n or j >= m:
            break
        pairs, di, dj = _repair(ref, mine, i, j, surplus)
        for a, b in pairs:
            out[b] = a
        if not pairs:
            out[j:j + dj] = -(1 + i)
        i, j = i + di, j + dj
    out[j:] = -(1 + n)
    return out


def _sequence(rows: np.ndarray, seq, op, size) -> RankOrder:
    return RankOrder(rows, seq[rows], op[rows], size[rows])


def _with_codes(seqs: list[RankOrder]) -> None:
    """Give a group's sequences one integer per distinct (op, size) among them."""
    op = np.concatenate([s.op for s in seqs])
    size = np.concatenate([s.size for s in seqs])
    _, code = np.unique(np.stack([op, size], axis=1), axis=0, return_inverse=True)
    code = code.reshape(-1)
    k = 0
    for s in seqs:
        s.code = code[k:k + len(s.seq)]
        k += len(s.seq)


def _disagrees(ref: RankOrder, mine: RankOrder) -> bool:
    """Whether the two hold a seq value with another op or size (each value once on each rank)."""
    _, ia, ib = np.intersect1d(ref.seq, mine.seq, assume_unique=True, return_indices=True)
    return bool(ia.size) and not _compatible(ref.op[ia], ref.size[ia], mine.op[ib], mine.size[ib]).all()


def _slots(ref: RankOrder, mine: RankOrder, paired: np.ndarray) -> np.ndarray:
    """(slot, code, n-th) per collective of `mine`: slot 2·ref seq where paired, else an odd slot between the ref
    collectives around it, with its (op, size) code and how many of that code came before it in that slot (the
    same extra collective on several ranks lands in one instance)."""
    out = np.zeros((len(mine.seq), 3), np.int64)
    ref2 = 2 * ref.seq.astype(np.int64)
    lo = ref2[0] if ref2.size else 0
    hit = paired >= 0
    out[hit, 0] = ref2[paired[hit]]
    before = -paired[~hit] - 1  # ref collectives before it
    out[~hit, 0] = np.where(before > 0, ref2[np.maximum(before, 1) - 1] + 1, lo - 1)
    out[~hit, 1] = mine.code[~hit]
    seen: dict[tuple[int, int], int] = {}
    for r in np.flatnonzero(~hit).tolist():
        k = (int(out[r, 0]), int(out[r, 1]))
        out[r, 2] = seen.get(k, 0)
        seen[k] = out[r, 2] + 1
    return out


def _positional(ref: RankOrder, mine: RankOrder) -> np.ndarray:
    """A rank that agrees with the reference keeps its seq values: paired where ref holds the value, else extra."""
    pos = np.searchsorted(ref.seq, mine.seq)
    hit = (pos < len(ref.seq)) & (ref.seq[np.minimum(pos, len(ref.seq) - 1)] == mine.seq)
    return np.where(hit, pos, -(1 + pos))


def _group_keys(seqs: list[RankOrder], realigned: list[int]) -> np.ndarray | None:
    """Dense instance numbers of one group's rows (in the order of `seqs`' rows) when some rank was realigned
    (its index into `seqs` appended to `realigned`), else None (the seq values stand)."""
    ref = seqs[0]
    bad = [x for x, mine in enumerate(seqs[1:], start=1) if _disagrees(ref, mine)]
    if not bad:
        return None
    _with_codes(seqs)
    walked = {x: align_sequences(ref, seqs[x]) for x in bad}
    realigned.extend(walked)
    parts = [_slots(ref, ref, np.arange(len(ref.seq)))]
    parts += [_slots(ref, mine, walked[x] if x in walked else _positional(ref, mine))
              for x, mine in enumerate(seqs[1:], start=1)]
    slots = np.concatenate(parts)
    _, inv = np.unique(slots, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def _torch_numbered(nccl_seq: np.ndarray, rank: np.ndarray) -> bool:
    """Whether torch's sequence number can number the group: every row has one, each once per rank."""
    if nccl_seq.size == 0 or (nccl_seq < 0).any():
        return False
    o = np.lexsort((nccl_seq, rank))  # a sort: np.unique(axis=0) of the pairs took 3 ms per group of 8.7k rows
    r, q = rank[o], nccl_seq[o]
    return not bool(np.any((r[1:] == r[:-1]) & (q[1:] == q[:-1])))


def _size_compared(op: np.ndarray, size: np.ndarray, variable: np.ndarray | None) -> np.ndarray:
    """Sizes as compared: −1 for ops whose size differs across ranks by design (`variable`, per op id)."""
    if variable is None or not op.size or not variable.size:
        return size.astype(np.int64)
    v = np.append(np.asarray(variable, bool), False)
    return np.where(v[np.minimum(op, v.size - 1)], -1, size).astype(np.int64)


def instance_numbers(rows: Table, sel: np.ndarray, variable: np.ndarray | None = None) -> Numbering:
    """Instance number within (pg, window) of each row `sel` of `rows` (rank, window, pg, seq, op_id, bytes and,
    optionally, nccl_seq), by the rules of the module docstring; `variable`: per op id, whether its sizes differ
    across ranks by design (not compared)."""
    rank = np.asarray(rows["rank"], np.int64)[sel]
    window = np.asarray(rows["window"], np.int64)[sel]
    pg = np.asarray(rows["pg"], np.int64)[sel]
    seq = np.asarray(rows["seq"], np.int64)[sel]
    op = np.asarray(rows["op_id"], np.int64)[sel]
    size = _size_compared(op, np.asarray(rows["bytes"], np.int64)[sel], variable)
    nseq = np.asarray(rows["nccl_seq"], np.int64)[sel] if "nccl_seq" in rows else np.full(sel.size, -1, np.int64)
    out = Numbering(seq.copy())
    if not sel.size:
        return out
    order = np.lexsort((seq, rank, window, pg))
    grp = np.r_[0, np.flatnonzero((np.diff(pg[order]) != 0) | (np.diff(window[order]) != 0)) + 1, order.size]
    for a, b in zip(grp[:-1].tolist(), grp[1:].tolist()):
        g = order[a:b]
        if _torch_numbered(nseq[g], rank[g]):
            out.key[g] = nseq[g]
            out.torch_groups += 1
            continue
        cut = np.r_[0, np.flatnonzero(np.diff(rank[g])) + 1, g.size]
        seqs = [_sequence(g[c:d], seq, op, size) for c, d in zip(cut[:-1].tolist(), cut[1:].tolist())]
        if any(np.any(np.diff(s.seq) == 0) for s in seqs):
            continue  # a rank holds a seq value twice: left as it is (matching reports it)
        walked: list[int] = []
        keys = _group_keys(seqs, walked)
        if keys is not None:
            out.key[np.concatenate([s.rows for s in seqs])] = keys
            out.realigned += [(int(pg[g[0]]), int(window[g[0]]), int(rank[seqs[x].rows[0]])) for x in walked]
    return out
