"""A restore's replay of the state's changelogs: vectorised in Arrow, against row by row.

A crash restart rebuilds the state from the last snapshot and each changelog
after it (``stream/changelog.py``). This times that replay on an ``ops`` table
of N pending operations (the state's schema) and K changelogs, each removing
``--touched`` rows of the state as it stands and adding as many new ones, as
a steady micro-batch that touches old keys does. Three ways, in one process:

- ``tickwheel``: :func:`~tickwheel.pipeline.stream.changelog.apply_table_changes`,
  the library's replay (an anti-join on the rows and their copy numbers);
- ``row by row``: the same multiset difference in Python over each row's tuple,
  the replay the library had before (a :class:`collections.Counter` of the removed
  rows, then a pass over the state);
- ``floor``: what any replay must pay on these tables: each changelog's added
  rows appended and its removed rows filtered out by a mask computed beforehand,
  no matching at all.

Every way's result is checked equal to the others' (as sorted rows) before
timings are printed. Run:
``.venv/bin/python benchmarks/bench_state_replay.py --pending 1e5 1e6 --changelogs 9``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwheel.pipeline.stream.changelog import apply_table_changes

OPS = pa.schema([("kind", pa.string()), ("rule", pa.string()), ("key", pa.string()),
                 ("event_id", pa.string()), ("time", pa.int64()),
                 ("deadline", pa.int64())])  # fmt: skip

Change = tuple[pa.Table, pa.Table, np.ndarray]  # added, removed, the floor's mask


def _ops(start: int, count: int) -> pa.Table:
    ids = np.arange(start, start + count)
    text = pa.array(ids.astype(str))
    return pa.table(
        [pa.array(np.full(count, "pending")), pa.array(np.full(count, "payment")),
         pc.binary_join_element_wise("o", text, ""), pc.binary_join_element_wise("e", text, ""),
         pa.array(ids * 1_000), pa.array(ids * 1_000 + 1_800_000)],
        schema=OPS,
    )  # fmt: skip


def _changelogs(state: pa.Table, count: int, touched: int, seed: int) -> list[Change]:
    """``count`` changelogs over ``state``: each removes ``touched`` of its rows as they
    then stand and adds as many new ones."""
    rng = np.random.default_rng(seed)
    changes: list[Change] = []
    current, fresh = state, state.num_rows
    for _ in range(count):
        rows = current.num_rows
        taken = rng.choice(rows, size=min(touched, rows), replace=False)
        mask = np.ones(rows, dtype=bool)
        mask[taken] = False
        added = _ops(10**9 + fresh, touched)
        fresh += touched
        changes.append((added, current.take(pa.array(taken)), mask))
        current = pa.concat_tables([current.filter(mask), added])
    return changes


def replay_vectorised(state: pa.Table, changes: list[Change]) -> pa.Table:
    for added, removed, _ in changes:
        state = apply_table_changes(state, added, removed)
    return state


def replay_row_by_row(state: pa.Table, changes: list[Change]) -> pa.Table:
    for added, removed, _ in changes:
        drop = Counter(zip(*(c.to_pylist() for c in removed.columns), strict=True))
        kept = []
        for row in zip(*(c.to_pylist() for c in state.columns), strict=True):
            if drop[row]:
                drop[row] -= 1
            else:
                kept.append(row)
        columns = list(zip(*kept, strict=True)) or [() for _ in OPS]
        remaining = pa.table(
            [pa.array(list(v), f.type) for v, f in zip(columns, OPS, strict=True)], OPS
        )
        state = pa.concat_tables([remaining, added])
    return state


def replay_floor(state: pa.Table, changes: list[Change]) -> pa.Table:
    for added, _, mask in changes:
        state = pa.concat_tables([state.filter(mask), added])
    return state


def _best(way: Callable[[pa.Table, list[Change]], pa.Table], state: pa.Table,
          changes: list[Change], repeat: int) -> tuple[float, pa.Table]:  # fmt: skip
    best, out = float("inf"), state
    for _ in range(repeat):
        start = time.perf_counter()
        out = way(state, changes)
        best = min(best, time.perf_counter() - start)
    return best, out


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", nargs="+", type=float, default=[1e5, 1e6])
    parser.add_argument("--changelogs", type=int, default=9)
    parser.add_argument("--touched", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--row-by-row-max", type=float, default=1e6,
                        help="skip the row-by-row way above this many pending")  # fmt: skip
    args = parser.parse_args(argv)
    print(f"{args.changelogs} changelogs, {args.touched} rows removed and added each")
    print(f"{'pending':>10} {'tickwheel s':>12} {'row by row s':>13} {'floor s':>9} "
          f"{'row by row / tickwheel':>23} {'tickwheel / floor':>18}")  # fmt: skip
    for pending in (int(p) for p in args.pending):
        state = _ops(0, pending)
        changes = _changelogs(state, args.changelogs, args.touched, seed=pending)
        ours, got = _best(replay_vectorised, state, changes, args.repeat)
        floor, want = _best(replay_floor, state, changes, args.repeat)
        if not _sorted(got).equals(_sorted(want)):
            raise SystemExit(f"the vectorised replay differs from the floor's at {pending}")
        slow = None
        if pending <= args.row_by_row_max:
            slow, rows = _best(replay_row_by_row, state, changes, 1)
            if not _sorted(rows).equals(_sorted(want)):
                raise SystemExit(f"the row-by-row replay differs at {pending}")
        ratio = f"{slow / ours:.1f}x" if slow is not None else "-"
        slow_text = f"{slow:.3f}" if slow is not None else "-"
        print(f"{pending:>10,} {ours:>12.3f} {slow_text:>13} {floor:>9.3f} {ratio:>23} "
              f"{ours / floor:>17.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
