"""Which ranks break a job's group structure, by torch.distributed's semantics.

In a model-parallel job (tensor, pipeline, expert parallel) ranks legitimately wait at
different places: a collective on a group its caller passed (``group=tp_group``) involves
only that group's members, so one tensor-parallel group in attention's all_reduce and
another in the MLP's wait for nobody outside their own groups. A collective on WORLD (no
group, ``group=None``, the default group) waits for every rank. So the classes of ranks
(one class per op and call path, ``classify``) are judged by their *scope*:

- ``Scope.WORLD``: the call arguments say WORLD, or the call line shows no group (a complete
  call with only the arguments before the group's place) or ``group=None``/``group.WORLD``;
- ``Scope.PART``: the arguments say a passed or named group, the call line passes
  ``group=`` something else, or the op is a send/recv (it involves its pair only);
- ``None``: nothing says (no arguments, no source line).

``sides`` then groups the classes that are legitimately apart: where some class is a WORLD
op, every class on a passed group is one side, *the structure* (its ranks wait only inside
their groups), each other class a side of its own; the culprits are the ranks outside the
side that holds a majority of the ranks (the ranks in the WORLD op, when they are the few
that left the structure: their groups wait for them, and they wait for everyone). Without a
WORLD op, classes that are all on passed groups and could each be whole groups of one size
(their sizes share a divisor above 1) are a structure with no one outside it
(``whole_groups``).

Where the classes name no minority and no WORLD op is among them, ``tiny_parting`` reads
the merged call tree instead: where the ranks' paths first part, a side that is one class
with fewer ranks than every other class is not a place of the structure (each of those
holds whole groups) but ranks that left it. Culprits named that way rest on the tree's
shape only.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from math import gcd

from ..model import GIVEN_GROUP, WORLD_GROUP, DistOp, Frame, OpKind
from .views import RankView


class Scope(enum.Enum):
    """Which ranks a collective waits for."""

    WORLD = "world"
    """Every rank of the job (no group passed, ``group=None``, the default group)."""
    PART = "part"
    """The members of a group its caller passed, or a send/recv's pair."""


class ScopeFrom(enum.Enum):
    """Where a class's scope was read."""

    ARGUMENTS = "arguments"  # the call's arguments (``DistOp.group``), or the op's kind
    LINE = "line"  # the call line's text (``Frame.code``)


# ``group=`` values that name the default group
_WORLD_VALUES = frozenset(
    {
        "None",
        "WORLD",
        "group.WORLD",
        "dist.group.WORLD",
        "torch.distributed.group.WORLD",
        "GroupMember.WORLD",
        "dist.GroupMember.WORLD",
        "_get_default_group()",
        "dist.distributed_c10d._get_default_group()",
    }
)
_GROUP_KW = re.compile(r"\bgroup\s*=\s*([^,)]+)")
# how many positional arguments come before ``group`` in torch.distributed's signatures: a
# complete call with at most these, and no ``group=``, runs on WORLD
_BEFORE_GROUP = {
    "barrier": 0,
    "monitored_barrier": 0,
    "all_reduce": 2,
    "all_reduce_coalesced": 2,
    "broadcast": 2,
    "reduce": 3,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "_all_gather_base": 2,
    "gather": 3,
    "scatter": 4,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "_reduce_scatter_base": 3,
    "all_to_all": 2,
    "all_to_all_single": 4,
    "all_gather_object": 2,
    "gather_object": 3,
    "broadcast_object_list": 2,
    "scatter_object_list": 3,
}


@dataclass(frozen=True)
class ScopeRead:
    scope: Scope
    source: ScopeFrom


def op_scope(op: DistOp | None) -> ScopeRead | None:
    """The scope of ``op``: from its arguments, its kind, or its call line; None when
    nothing says."""
    if op is None:
        return None
    if op.kind is OpKind.P2P:
        return ScopeRead(Scope.PART, ScopeFrom.ARGUMENTS)
    if op.group == WORLD_GROUP:
        return ScopeRead(Scope.WORLD, ScopeFrom.ARGUMENTS)
    if op.group == GIVEN_GROUP or (op.group or "").startswith("name:"):
        return ScopeRead(Scope.PART, ScopeFrom.ARGUMENTS)
    scope = line_scope(op.name, op.call_site)
    return ScopeRead(scope, ScopeFrom.LINE) if scope is not None else None


def line_scope(name: str, site: Frame | None) -> Scope | None:
    """The scope the call line shows: ``group=X`` (WORLD when X names the default group), or
    a complete call of ``name`` with no more positional arguments than come before the
    group's place (WORLD). None when the line is not had, or is cut, or says neither.

    A wrapper that passes its own ``group`` parameter on (``all_reduce(t, group=group)``)
    reads as a passed group here though its caller may have passed None; call arguments,
    where captured, decide instead (``op_scope``)."""
    code = site.code if site is not None else None
    if not code:
        return None
    found = _GROUP_KW.search(code)
    if found is not None:
        return Scope.WORLD if found.group(1).strip() in _WORLD_VALUES else Scope.PART
    before = _BEFORE_GROUP.get(name)
    call = re.search(rf"\b{re.escape(name)}\s*\(", code)
    if before is None or call is None:
        return None
    positional = _positional(code[call.end() :])
    return Scope.WORLD if positional is not None and positional <= before else None


def _positional(args: str) -> int | None:
    """How many positional arguments the call whose arguments start ``args`` has; None
    when the call does not close on the line."""
    depth, count, token, keyword = 0, 0, False, False
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return count + (1 if token and not keyword else 0)
            depth -= 1
        elif depth == 0 and ch == ",":
            count += 1 if token and not keyword else 0
            token = keyword = False
            continue
        elif depth == 0 and ch == "=" and args[i + 1 : i + 2] != "=" and args[i - 1 : i] not in "=!<>":
            keyword = True
        elif depth == 0 and ch == "*":
            return None  # *args: any number
        if not ch.isspace():
            token = True
    return None


@dataclass(frozen=True)
class Structure:
    """How the classes' scopes explain the ranks' places.

    ``world``: the classes on WORLD; ``part``: the classes on passed groups (legitimately
    apart from each other); ``unseen``: classes whose scope nothing says. ``from_lines``:
    some scope was read from a call line, not from arguments."""

    world: Sequence[Sequence[RankView]]
    part: Sequence[Sequence[RankView]]
    unseen: Sequence[Sequence[RankView]]
    from_lines: bool


def structure_of(classes: Sequence[Sequence[RankView]]) -> Structure:
    """The classes by scope (a class whose ranks' ops disagree, or say nothing, is unseen)."""
    world: list[Sequence[RankView]] = []
    part: list[Sequence[RankView]] = []
    unseen: list[Sequence[RankView]] = []
    from_lines = False
    reads: dict[int, ScopeRead | None] = {}  # ranks of one class share op objects
    for views in classes:
        scopes = set()
        for v in views:
            key = id(v.op)
            if key not in reads:
                reads[key] = op_scope(v.op)
            scopes.add(reads[key])
        read = scopes.pop() if len(scopes) == 1 else None
        if read is None:
            unseen.append(views)
            continue
        from_lines |= read.source is ScopeFrom.LINE
        (world if read.scope is Scope.WORLD else part).append(views)
    return Structure(world, part, unseen, from_lines)


def sides(s: Structure) -> list[list[int]]:
    """The ranks by side: with a WORLD op among the classes, the classes on passed groups
    are one side (the structure); otherwise every class is a side of its own."""
    if s.world and len(s.part) > 1:
        merged = [v.rank for c in s.part for v in c]
        return [merged, *([v.rank for v in c] for c in (*s.world, *s.unseen))]
    return [[v.rank for v in c] for c in (*s.world, *s.part, *s.unseen)]


def minority(groups: list[list[int]]) -> list[int]:
    """The ranks outside the group that holds more than half of them; [] when none does
    (a "minority" of half the ranks or more is no minority)."""
    total = sum(len(g) for g in groups)
    biggest = max(groups, key=len, default=[])
    if len(groups) < 2 or 2 * len(biggest) <= total:
        return []
    return sorted(r for g in groups if g is not biggest for r in g)


def whole_groups(s: Structure) -> int | None:
    """The largest group size every class could be made of, when the classes are all on
    passed groups, none on WORLD, and their sizes share a divisor above 1; None otherwise.
    (A split group leaves classes whose sizes share none: three ranks of a group of 8 in
    one op, five in another.)"""
    if s.world or s.unseen or len(s.part) < 2:
        return None
    size = reduce(gcd, (len(c) for c in s.part))
    return size if size > 1 else None


def tiny_parting(
    parted: Sequence[tuple[Frame, Sequence[RankView]]], classes: Sequence[Sequence[RankView]]
) -> list[int]:
    """The ranks outside the largest path where the paths first part, when they are one
    class with fewer ranks than every other class: each place of a structure of groups
    holds whole groups, so ranks fewer than any place, all at one place off the others'
    path, left the structure. [] otherwise (a side of several places is part of the
    structure, however small: a pipeline stage at its layers)."""
    if len(parted) < 2:
        return []
    others = {v.rank for _, vs in parted[1:] for v in vs}
    theirs = [c for c in classes if c and c[0].rank in others]
    if len(theirs) != 1 or len(theirs[0]) != len(others):
        return []
    rest = [len(c) for c in classes if c is not theirs[0]]
    return sorted(others) if rest and len(others) < min(rest) else []


def could_be_groups(parted: Sequence[tuple[Frame, Sequence[RankView]]], classes: Sequence[Sequence[RankView]]) -> bool:
    """Every class on the largest path where the paths part holds two ranks or more: each
    could be whole groups at its place. (A collective on a group of one rank never waits,
    so a class of one rank is no whole group: the ops there are not a structure.)"""
    if not parted:
        return False
    on_path = {v.rank for v in parted[0][1]}
    return all(len(c) > 1 for c in classes if c and c[0].rank in on_path)
