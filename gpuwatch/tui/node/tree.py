"""The tree view: GPU processes under their parents, as `pstree` would draw them.

Pure: rows and each process's parent in, rows in tree order out, with the
branch to draw before each command. A parent that uses no GPU (a launcher such
as `torchrun`, a shell) gets a row of kind `parent`; the chain above the first
process with two children is left out, so a tree starts where it branches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
from msgspec.structs import replace

from gpuwatch.tui.common.frames import Ancestor
from gpuwatch.tui.node.rows import Row


def tree_order(rows: Sequence[Row], ancestors: Mapping[int, Ancestor], source: str) -> list[Row]:
    """`rows` (already sorted; those of `source` are arranged) in tree order, branches drawn."""
    mine = [r for r in rows if r.source == source and r.kind != "waiting"]
    by_pid: dict[int, list[Row]] = {}
    for row in mine:
        by_pid.setdefault(row.pid, []).append(row)
    parent = _break_cycles(_parents(by_pid, ancestors))
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    roots = [pid for pid, ppid in parent.items() if ppid is None]
    roots = [_first_branch(pid, by_pid, children) for pid in roots]
    rank = {row.key: position for position, row in enumerate(rows)}
    first = _first_ranks(roots, by_pid, children, rank)
    tree = _Tree(by_pid, children, first, ancestors, source)
    for root in sorted(roots, key=lambda pid: first[pid]):
        tree.walk(root, "", None)
    rest = [r for r in rows if r.source != source or r.kind == "waiting"]
    return tree.ordered + rest


def _parents(
    by_pid: Mapping[int, list[Row]], ancestors: Mapping[int, Ancestor]
) -> dict[int, int | None]:
    """Every process of the tree and its parent in it (`None` for a root)."""
    parent: dict[int, int | None] = {}
    for pid in by_pid:
        current = pid
        for _ in range(64):  # a loop in forged data must end
            if current in parent:
                break
            known = ancestors.get(current)
            ppid = known.ppid if known is not None and known.ppid > 1 else None
            parent[current] = ppid
            if ppid is None:
                break
            current = ppid
    return parent


def _break_cycles(parent: dict[int, int | None]) -> dict[int, int | None]:
    """Cuts any loop of parents (only forged data has one), so every process has a root."""
    settled: set[int] = set()
    for start in parent:
        path: list[int] = []
        current: int | None = start
        while current is not None and current not in settled:
            if current in path:
                parent[current] = None  # the loop closes here: make it a root
                break
            path.append(current)
            current = parent.get(current)
        settled.update(path)
    return parent


def _first_branch(pid: int, by_pid: Mapping[int, list[Row]], children: dict[int, list[int]]) -> int:
    """Skips a root's single-child chain of processes that use no GPU."""
    while pid not in by_pid and len(children.get(pid, [])) == 1:
        pid = children[pid][0]
    return pid


def _first_ranks(
    roots: Sequence[int],
    by_pid: Mapping[int, list[Row]],
    children: Mapping[int, list[int]],
    rank: Mapping[str, int],
) -> dict[int, int]:
    """The best sort position of any row in each subtree (a subtree sorts by its best)."""
    first: dict[int, int] = {}

    def visit(pid: int, depth: int) -> int:
        best = min((rank.get(r.key, 1 << 30) for r in by_pid.get(pid, [])), default=1 << 30)
        if depth < 64:
            for child in children.get(pid, []):
                best = min(best, visit(child, depth + 1))
        first[pid] = best
        return best

    for root in roots:
        visit(root, 0)
    return first


class _Tree(msgspec.Struct):
    """A source's processes, each under its parent, and the rows in tree order so far."""

    by_pid: Mapping[int, list[Row]]
    children: Mapping[int, list[int]]
    first: Mapping[int, int]
    """The best sort position in each subtree."""
    ancestors: Mapping[int, Ancestor]
    source: str
    ordered: list[Row] = msgspec.field(default_factory=list)

    def walk(self, pid: int, indent: str, last: bool | None) -> None:
        """Puts `pid`'s rows (or its parent row) in order, then its children's, best first."""
        branch = "" if last is None else indent + ("└─ " if last else "├─ ")
        own = self.by_pid.get(pid) or [_parent_row(pid, self.ancestors.get(pid), self.source)]
        self.ordered.extend(replace(row, branch=branch) for row in own)
        below = sorted(self.children.get(pid, []), key=lambda child: self.first.get(child, 1 << 30))
        deeper = "" if last is None else indent + ("   " if last else "│  ")
        if len(deeper) > 3 * 32:
            return  # deeper than any real process tree: forged data
        for position, child in enumerate(below):
            self.walk(child, deeper, position == len(below) - 1)


def _parent_row(pid: int, ancestor: Ancestor | None, source: str) -> Row:
    return Row(
        key=f"{source}/parent/{pid}",
        source=source,
        pid=pid,
        kind="parent",
        user=None if ancestor is None else ancestor.user,
        command=None if ancestor is None else ancestor.name,
        device="-",
    )
