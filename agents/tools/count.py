"""The `word_count` tool's command (agents/tools/word_count.yaml).

cadre runs it without a shell, in this file's folder, with the call's
parameters as one JSON object on stdin (with `idempotency_key` beside them
when the call has one: this tool only reads, so it ignores it); what it prints on stdout (one JSON
value) is the tool's output. A non-zero exit fails the call with the first
lines of stderr. Python's standard library only.
"""

import json
import sys


def main() -> int:
    params = json.load(sys.stdin)
    text = params.get("text")
    if not isinstance(text, str):
        print("`text` must be a string", file=sys.stderr)
        return 2
    json.dump(
        {
            "words": len(text.split()),
            "lines": len(text.splitlines()),
            "characters": len(text),
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
