"""Messages the studio shows to its clients without the server's absolute paths (issue 19 item 13).

An engine failure (`FileNotFoundError: [Errno 2] No such file or directory: '/srv/h3/clips/ab/….mp4'`), a LoRA
tier whose file is missing, or an engine that failed to load would otherwise tell every client where the server
keeps its data, models and code. `hide_paths` keeps the file's name, which says what went wrong, and drops the
folders: `…/x.mp4`. The server's log keeps the full message.

Only absolute paths whose first folder exists on this machine, or that end in a file name with an extension, are
rewritten, so the URL paths messages name (`POST /v1/videos`, `/health`) stay as they are.
"""

from __future__ import annotations

import os
import re

_ABSOLUTE = re.compile(r"(?<![\w.:/~-])/[^\s'\"()\[\]{},;<>|`]+")
_FILE_NAME = re.compile(r"\w\.[A-Za-z0-9]{1,12}$")


def _rewrite(match: re.Match) -> str:
    path = match.group(0)
    trailing = ""
    while path and path[-1] in ".:":  # the sentence's punctuation, not the path's
        path, trailing = path[:-1], path[-1] + trailing
    parts = [part for part in path.split("/") if part]
    if not parts or not (os.path.isdir("/" + parts[0]) or (len(parts) > 1 and _FILE_NAME.search(parts[-1]))):
        return match.group(0)
    return ("…/" + parts[-1] if len(parts) > 1 else "…") + trailing


def hide_paths(text: str | None) -> str | None:
    """`text` with every absolute server path reduced to `…/<file name>` (None stays None)."""
    if not text:
        return text
    return _ABSOLUTE.sub(_rewrite, text)


__all__ = ["hide_paths"]
