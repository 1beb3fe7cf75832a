"""A stdio "MCP server" that never answers: it reads every request Antler sends (`server/discover`,
`initialize`, ...) and replies to none, as a server stuck at start-up does (a blocked import, a prompt on
a closed terminal, a lock held by another process). Used by `mcp_isolation` to show that one such server
delays no call or listing that does not need it.

    hung_server.py [MARK_DIR]

With MARK_DIR, each request line read is appended to MARK_DIR/requests.log, so a test can see that the
server was asked (and so that "no answer" is the server's doing, not a start failure).
"""

import os
import sys


def main() -> None:
    marks = sys.argv[1] if len(sys.argv) > 1 else None
    log = open(os.path.join(marks, "requests.log"), "a", buffering=1) if marks else None
    for line in sys.stdin:
        if log is not None:
            log.write(line if line.endswith("\n") else line + "\n")
    # stdin closed: the client went away; exit quietly.


if __name__ == "__main__":
    main()
