"""One line to the user's terminal from inside a Ray Train worker, printed once.

Ray Train V2 replaces `print` in its workers with a function that logs the message through the root logger and, when
`sys.stdout` is not the interpreter's own (in a Ray worker it never is), also prints it: every `print` reached the
driver twice. Writing to the stream directly sends it once, through Ray's log forwarding like any worker output.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()
