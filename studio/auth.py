"""Accounts from an --auth file: HTTP Basic for REST, the same accounts for Gradio's login, and their roles.

The file is either JSON — {"alice": "secret", "root": {"password": "pw", "role": "admin"}, ...} or
[{"username": "alice", "password": "secret", "role": "reviewer"}, ...] — or plain text with one
``user:password`` per line (blank lines and lines starting with # are skipped; spaces around the colon are
not part of the name or the password). The user name is the reviewer identity recorded with verdicts. Roles:
"reviewer" (the default, so files without roles keep working) and "admin" (may also delete jobs, cancel other
people's jobs and change the approval rule).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("reviewer", "admin")


class AuthFileError(ValueError):
    """The auth file is missing or malformed; the message names the file and the line or entry."""


@dataclass(frozen=True)
class Accounts:
    """user name → password, and user name → role (absent: reviewer). Comparisons run in constant time."""

    passwords: dict[str, str]
    roles: dict[str, str] = field(default_factory=dict)

    def role(self, username: str | None) -> str | None:
        """The user's role; None for an unknown user."""
        return self.roles.get(username, "reviewer") if username in self.passwords else None

    def check(self, username: str | None, password: str | None) -> bool:
        """True when the user exists and the password matches."""
        if not username or password is None:
            return False
        expected = self.passwords.get(username)
        # Compare against something even for unknown users, so timing does not reveal which names exist.
        ok = secrets.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok

    def gradio_auth(self) -> Callable[[str, str], bool]:
        """The callable Gradio's ``auth=`` accepts."""
        return self.check


def load_accounts(path: str | Path) -> Accounts:
    """Read an auth file (JSON or ``user:password`` lines); AuthFileError says what is wrong where."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise AuthFileError(f"cannot read auth file {path}: {error}") from None
    stripped = text.lstrip()
    entries = _from_json(path, stripped) if stripped[:1] in ("{", "[") else _from_lines(path, text)
    if not entries:
        raise AuthFileError(f"auth file {path} defines no accounts")
    return Accounts({user: password for user, (password, _) in entries.items()},
                    {user: role for user, (_, role) in entries.items()})


def _from_json(path: Path, text: str) -> dict[str, tuple[str, str]]:
    """user → (password, role)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise AuthFileError(f"auth file {path} is not valid JSON: {error}") from None
    if isinstance(data, dict):
        # "user": "password" (a reviewer) or "user": {"password": ..., "role": ...}
        items = [{"username": user, **(value if isinstance(value, dict) else {"password": value})}
                 for user, value in data.items()]
    elif isinstance(data, list):
        items = data
    else:
        raise AuthFileError(f"auth file {path}: expected an object or a list of accounts")
    entries = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "username" not in item or "password" not in item:
            raise AuthFileError(f"auth file {path}: entry {index} needs \"username\" and \"password\"")
        user = _name(path, item["username"])
        entries[user] = (_password(path, user, item["password"]), _role(path, user, item.get("role", "reviewer")))
    return entries


def _from_lines(path: Path, text: str) -> dict[str, tuple[str, str]]:
    """user → (password, "reviewer"): roles need the JSON form."""
    accounts = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep:
            raise AuthFileError(f"auth file {path}, line {number}: expected user:password")
        # "alice: secret" means the password "secret": spaces around the colon are layout (the JSON form keeps
        # passwords byte for byte).
        accounts[_name(path, user.strip())] = (_password(path, user, password.strip()), "reviewer")
    return accounts


def _name(path: Path, user: object) -> str:
    if not isinstance(user, str) or not user.strip() or ":" in user:
        raise AuthFileError(f"auth file {path}: user names must be non-empty strings without ':', got {user!r}")
    return user.strip()


def _password(path: Path, user: object, password: object) -> str:
    if not isinstance(password, str) or not password:
        raise AuthFileError(f"auth file {path}: user {user!r} needs a non-empty password")
    return password


def _role(path: Path, user: str, role: object) -> str:
    if role not in ROLES:
        raise AuthFileError(f"auth file {path}: user {user!r} has role {role!r}; roles are {', '.join(ROLES)}")
    return role
