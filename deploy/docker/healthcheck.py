#!/usr/bin/env python3
"""Container healthcheck: exit 0 when an HTTP endpoint answers 2xx, 1 otherwise.

Standard library only, so it works in the slim gateway image (no curl or wget there) and in
the reward-worker image alike. Usage: ``pandora-healthcheck [URL]``; the default URL is
``http://127.0.0.1:$PANDORA_PORT/health`` (port 8080 when unset).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    port = os.environ.get("PANDORA_PORT", "8080")
    url = argv[1] if len(argv) > 1 else f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return 0 if 200 <= response.status < 300 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
