"""Who is acting, and what they may do: reviewers act on their own work, admins on everyone's.

With --auth every request carries an `Actor` (the signed-in user and their role from the auth file). Without
--auth there are no accounts, so the studio behaves as before: anyone may do anything (`OPEN`).

Admin only: deleting jobs, cancelling other people's jobs, changing the approval rule.
"""

from __future__ import annotations

from dataclasses import dataclass


class Forbidden(Exception):
    """An authenticated user asked for something only another user (or an admin) may do; names the field."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


@dataclass(frozen=True)
class Actor:
    """The user behind a request. `name` None: the studio runs without accounts."""

    name: str | None
    admin: bool

    def require_admin(self, field: str, what: str) -> None:
        if not self.admin:
            raise Forbidden(field, f"only an admin may {what}; {self.name!r} is a reviewer")

    def require_owner(self, owner: str | None, field: str, what: str) -> None:
        """Reviewers may act on what they submitted; admins on anything."""
        if not self.admin and owner != self.name:
            raise Forbidden(field, f"only {owner or 'its submitter'} or an admin may {what}")


OPEN = Actor(None, admin=True)  # no --auth: everyone may do everything, as before roles existed
