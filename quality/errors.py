"""The quality module's one error type for problems the user caused (a bad file, a mismatched pair).

The CLI prints it as `error: …` with exit code 2; the studio shows the message next to the pair. Its message
names the problem and, where there is one, the way out (for example `--align`).
"""

from __future__ import annotations


class QualityError(ValueError):
    """A clip or pair that cannot be compared as asked. The message names the file or the mismatch."""
