"""How the suite is dealt to pytest-xdist's workers (.ci/run: `-n 2 --dist loadgroup --no-loadscope-reorder`).

conftest.py gives every test an xdist_group mark, and xdist hands each group whole to one worker:
  - the browser tests share one group: they use the session's two studio subprocesses (conftest.py's
    browser_studios, 10-15 s of start-up each); split over two workers, each worker would start its own two;
  - the tests that use conftest.py's kite_clip (a 50-step nano generation per process) share one group, so it is
    made once, as in a serial run;
  - every other test's group is its module, so a module-scoped fixture (a studio that made pairs, studio servers,
    a worker process group) is made once too.
xdist deals the groups out in collection order, the next one to whichever worker runs low. A long group dealt last
keeps one worker busy while the other idles, so `dealing_order` puts the long groups first: the browser group, then
every group holding a "slow" test, then the rest, each tier in its modules' order.
"""

from __future__ import annotations

import pytest

BROWSER_GROUP = "browser"
KITE_GROUP = "kite_clip"
# Modules whose tests take conftest.py's kite_clip (tests/nano_inputs.py's KITE clip).
KITE_MODULES = ("tests/test_media.py", "tests/test_remote.py")


def group_of(item: pytest.Item) -> str:
    """The xdist group of a test whose markers are already set (conftest.py's MARKS)."""
    module = item.nodeid.partition("::")[0]
    if item.get_closest_marker("browser") is not None:
        return BROWSER_GROUP
    if module in KITE_MODULES:
        return KITE_GROUP
    return module


def dealing_order(items: list[pytest.Item], groups: list[str]) -> list[pytest.Item]:
    """`items` (with their groups, in the same order) reordered group by group, the long groups first."""
    first_seen: dict[str, int] = {}
    slow_groups = set()
    for index, (item, group) in enumerate(zip(items, groups)):
        first_seen.setdefault(group, index)
        if item.get_closest_marker("slow") is not None:
            slow_groups.add(group)

    def tier(group: str) -> int:
        return 0 if group == BROWSER_GROUP else 1 if group in slow_groups else 2

    order = sorted(range(len(items)), key=lambda i: (tier(groups[i]), first_seen[groups[i]], i))
    return [items[i] for i in order]


def mark_groups(items: list[pytest.Item]) -> None:
    """Give each test its xdist_group mark and put `items` in dealing order (in place). Called in xdist's workers
    only: their collections are what the controller deals out; a run without -n keeps its order."""
    groups = [group_of(item) for item in items]
    for item, group in zip(items, groups):
        item.add_marker(pytest.mark.xdist_group(group))
    items[:] = dealing_order(items, groups)
