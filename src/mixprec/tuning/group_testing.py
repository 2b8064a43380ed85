"""Group testing for a small set of modules to keep fp32: :func:`minimal_sufficient` (a
galloping search for the shortest sufficient prefix of the risk order, then
divide-and-conquer pruning), and :func:`hierarchical_keep`, which applies it level by level
down the :class:`ModuleTree`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from mixprec.tuning.session import risk_key

__all__ = ["COMBINED_GAP_DB", "ModuleTree", "hierarchical_keep", "minimal_sufficient"]


def minimal_sufficient(units: Sequence[str], suffices: Callable[[frozenset[str]], bool], *,
                       max_prefix: int | None = None, empty_fails: bool = False,
                       ahead: Callable[[list[frozenset[str]]], None] | None = None) -> list[str] | None:
    """A minimal subset ``K`` of ``units`` with ``suffices(K)``, assuming ``suffices(units)``.

    ``suffices`` should be monotone (a superset of a sufficient set suffices). First a
    galloping then binary search finds the shortest sufficient prefix of ``units``
    (riskiest first); its last element is then necessary, and the rest of the prefix
    is pruned by divide and conquer (about ``2 k log2(n / k)`` calls for ``k`` needed
    units among ``n``).

    Args:
        units: candidates, most likely needed first.
        suffices: whether keeping exactly this set fp32 meets the bound.
        max_prefix: give up (return ``None``) when the shortest sufficient prefix is
            longer than this: the needed set is then too large to be worth pruning.
        empty_fails: the caller already knows the empty set does not suffice (skip
            testing it).
        ahead: told the sets the search may test next, before each test of a prefix
            (the galloping's next prefixes; the binary search's midpoint and the two
            midpoints after it), so a parallel evaluator can measure them meanwhile.
            The tests made, and so the result, are the same with or without it.

    Returns:
        The needed units, in ``units`` order (``None`` when ``max_prefix`` is exceeded).
    """
    units = list(units)
    if not units or (not empty_fails and suffices(frozenset())):
        return []
    # galloping: prefixes of 1, 2, 4, ... until one suffices (the full list is assumed to)
    low, high = 0, len(units)  # prefix of length `low` fails, `high` suffices
    if max_prefix is not None and max_prefix < len(units):
        if not suffices(frozenset(units[:max_prefix])):
            return None
        high = max_prefix
    def prefixes(lengths: Sequence[int]) -> None:
        if ahead is not None:
            ahead([frozenset(units[:n]) for n in dict.fromkeys(lengths) if 0 < n < len(units)])

    size = 1
    while size < high:
        prefixes([s for s in (size << k for k in range(high.bit_length() + 1)) if s < high])
        if suffices(frozenset(units[:size])):
            high = size
            break
        low = size
        size *= 2
    while high - low > 1:
        mid = (low + high) // 2
        prefixes([mid, (low + mid) // 2, (mid + high) // 2])
        if suffices(frozenset(units[:mid])):
            high = mid
        else:
            low = mid
    last = units[high - 1]
    rest = _prune(frozenset({last}), units[: high - 1], suffices, changed=True) if high > 1 else []
    chosen = set(rest) | {last}
    return [u for u in units if u in chosen]


def _prune(fixed: frozenset[str], candidates: list[str], suffices: Callable[[frozenset[str]], bool], *,
           changed: bool) -> list[str]:
    """Minimal subset of ``candidates`` that, with ``fixed``, suffices (``fixed | candidates`` does)."""
    if changed and suffices(fixed):
        return []
    if len(candidates) <= 1:
        return list(candidates)
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    need_second = _prune(fixed | frozenset(first), second, suffices, changed=bool(first))
    need_first = _prune(fixed | frozenset(need_second), first, suffices, changed=bool(need_second))
    return need_first + need_second


#: A block's layers "look harmless" when each one's own SQNR is more than this many dB
#: above the block's own SQNR: the block's error then comes from how they combine, and
#: the search keeps the block rather than searching inside it.
COMBINED_GAP_DB = 10.0


class ModuleTree:
    """The module tree the hierarchical search walks, with the profile's risk per node.

    Nodes are the weight-owning layers (``units``) and every module enclosing one;
    ``""`` is the whole target. A node's risk is its own error from
    :meth:`~mixprec.tuning.session.Session.risk` (an overflow or inf/NaN counts as riskiest); a node the
    profile did not measure (a ``ModuleList`` is never called) takes its riskiest
    child's.

    Args:
        rows: :meth:`~mixprec.tuning.session.Session.risk` rows.
        units: the weight-owning modules.
    """

    def __init__(self, rows: Sequence[dict[str, Any]], units: Sequence[str]):
        self.units = set(units)
        self.row = {r["module"]: r for r in rows}
        nodes: set[str] = set()
        for name in [*units, *self.row]:
            while name and name not in nodes:
                nodes.add(name)
                name = name.rpartition(".")[0]
        self.children: dict[str, list[str]] = {"": []}
        for name in sorted(nodes):
            self.children.setdefault(name, [])
            self.children.setdefault(name.rpartition(".")[0], []).append(name)
        self._risk: dict[str, tuple[bool, float]] = {}

    def _measured(self, name: str) -> dict[str, Any] | None:
        """The node's profile row, or ``None`` when its own error was not measured (a block
        with no row, or one the profile left at +inf)."""
        row = self.row.get(name)
        if row is None or (row["own_sqnr_db"] == math.inf and self.children.get(name)):
            return None
        return row

    def risk(self, name: str) -> tuple[bool, float]:
        """Sort key, riskiest first."""
        if name not in self._risk:
            row = self._measured(name)
            self._risk[name] = risk_key(row) if row is not None else min(
                (self.risk(c) for c in self.children.get(name, [])), default=(True, math.inf))
        return self._risk[name]

    def own_db(self, name: str) -> float | None:
        """The node's own SQNR in dB (``-inf`` for an overflow), ``None`` when not measured."""
        row = self._measured(name)
        if row is None:
            return None
        key = risk_key(row)
        return -math.inf if not key[0] else key[1]

    def ranked(self, names: Sequence[str]) -> list[str]:
        return sorted(names, key=self.risk)

    def inside(self, name: str) -> list[str]:
        """What searching inside ``name`` tests: its children, passing through chains of
        single children (a ``ModuleList`` under a lone encoder) to where the tree branches."""
        children = self.children.get(name, [])
        while len(children) == 1 and children[0] not in self.units:
            children = self.children.get(children[0], [])
        return list(children)

    def combined(self, name: str, gap_db: float = COMBINED_GAP_DB) -> bool:
        """Whether ``name``'s error comes from how its children combine: its own SQNR is
        measured and every child's is more than ``gap_db`` above it."""
        own = self.own_db(name)
        if own is None or own == -math.inf:
            return False
        for child in self.inside(name):
            child_db = self.risk(child)
            if not child_db[0] or child_db[1] <= own + gap_db:
                return False
        return True


def hierarchical_keep(tree: ModuleTree, top: Sequence[str], suffices: Callable[[frozenset[str]], bool], *,
                      max_prefix: int | None = None, notes: list[str] | None = None,
                      ahead: Callable[[list[frozenset[str]]], None] | None = None) -> list[str] | None:
    """A small set of modules to keep fp32, found top down through the module tree.

    At each level the nodes are group-tested riskiest first (:func:`minimal_sufficient`).
    The search descends into a node it must keep only when the node has more than one
    child and some child's own error could explain the node's (:meth:`ModuleTree.combined`
    is false); inside it the children are group-tested with everything else kept as
    found, and the node stays whole when more than half of its children would be needed.
    A node whose layers each look harmless is kept whole without further evaluations:
    its error comes from how they combine.

    Args:
        tree: the module tree with the profile's risk.
        top: the first level (for example the children of the model, or of the
            components that must otherwise stay fp32).
        suffices: whether keeping exactly this set of nodes fp32 meets the bound.
        max_prefix: passed to the first level (``None``: no limit).
        notes: remarks are appended here.
        ahead: passed to :func:`minimal_sufficient` (sets to measure ahead).

    Returns:
        The nodes to keep (blocks or layers), or ``None`` when the first level needs more
        than ``max_prefix`` nodes.
    """
    notes = notes if notes is not None else []
    noted: set[str] = set()

    def level(nodes: Sequence[str], fixed: frozenset[str], limit: int | None, empty_fails: bool) -> list[str] | None:
        needed = minimal_sufficient(tree.ranked(nodes), lambda keep: suffices(fixed | keep), max_prefix=limit,
                                    empty_fails=empty_fails,
                                    ahead=None if ahead is None else lambda keeps: ahead([fixed | k for k in keeps]))
        return None if needed is None else refine(list(needed), fixed)

    def refine(kept: list[str], fixed: frozenset[str]) -> list[str]:
        descend = []
        for node in kept:
            children = tree.inside(node)
            if len(children) < 2 or node in tree.units:
                continue
            if tree.combined(node):
                if node in noted:
                    continue
                noted.add(node)
                notes.append(f"{node}: kept whole, its error comes from how its layers combine "
                             f"(own {tree.own_db(node):.1f} dB; each part {COMBINED_GAP_DB:g}+ dB better)")
            else:
                descend.append(node)
        if len(descend) > 1:
            # one evaluation for the prior's guess: each block replaced by its riskiest part
            guess = {node: tree.ranked(tree.inside(node))[0] for node in descend}
            trial = [k for k in kept if k not in guess] + list(guess.values())
            if suffices(fixed | frozenset(trial)):
                return refine(trial, fixed)
        for node in descend:
            others = frozenset(k for k in kept if k != node)
            children = tree.inside(node)
            inner = level(children, fixed | others, len(children) // 2, empty_fails=True)
            if inner is not None:
                kept = [k for k in kept if k != node] + inner
        return kept

    return level(list(top), frozenset(), max_prefix, empty_fails=False)
