"""tests/scheduling.py: how the suite is dealt to pytest-xdist's workers (.ci/run's -n 2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.scheduling import BROWSER_GROUP, KITE_GROUP, KITE_MODULES, dealing_order, group_of


@dataclass
class FakeItem:
    """What scheduling reads of a pytest item: its node id and its markers' names."""

    nodeid: str
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_browser_and_kite_tests_share_a_group_and_the_rest_go_by_module():
    assert group_of(FakeItem("tests/test_ui_e2e.py::test_x", ("browser", "slow"))) == BROWSER_GROUP
    assert group_of(FakeItem("tests/test_review_e2e.py::test_y[a]", ("browser", "slow"))) == BROWSER_GROUP
    assert group_of(FakeItem("tests/test_media.py::test_z", ("slow",))) == KITE_GROUP
    assert group_of(FakeItem("tests/test_db.py::test_w")) == "tests/test_db.py"


def test_the_kite_modules_are_the_ones_that_take_kite_clip():
    tests = Path(__file__).resolve().parent
    users = sorted(f"tests/{path.name}" for path in tests.glob("test_*.py")
                   if "kite_clip" in path.read_text() and path.name != Path(__file__).name)
    assert users == sorted(KITE_MODULES)


def test_long_groups_are_dealt_first_and_each_group_stays_in_its_order():
    items = [FakeItem("tests/test_a.py::one"), FakeItem("tests/test_a.py::two"),
             FakeItem("tests/test_b.py::slow_one", ("slow",)), FakeItem("tests/test_b.py::quick"),
             FakeItem("tests/test_ui_e2e.py::page", ("browser", "slow")), FakeItem("tests/test_c.py::one"),
             FakeItem("tests/test_review_e2e.py::review", ("browser", "slow")),
             FakeItem("tests/test_d.py::big", ("slow",))]
    order = dealing_order(items, [group_of(item) for item in items])
    assert [item.nodeid for item in order] == [
        "tests/test_ui_e2e.py::page", "tests/test_review_e2e.py::review",  # the browser group
        "tests/test_b.py::slow_one", "tests/test_b.py::quick", "tests/test_d.py::big",  # groups with a slow test
        "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_c.py::one"]  # the rest, in module order

