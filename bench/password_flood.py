"""A password guesser for the abuse checks: kept-alive TLS connections sending random passwords.

    python bench/password_flood.py PORT SECONDS [CONNECTIONS] [ADDRESSES]

CONNECTIONS (64) threads, spread over ADDRESSES (4) loopback addresses from 127.0.0.2, each
on a kept-alive HTTPS connection to 127.0.0.1:PORT (the certificate is not checked: that
would cost the guesser only), ask for /metrics as an unknown user with a new random password
each time, as fast as they are answered, coming back at once when let go. Prints `flooding`
when started, and after SECONDS one line: `requests=N cpu_s=S` and the count of each status.
"""

from __future__ import annotations

import base64
import http.client
import os
import secrets
import ssl
import sys
import threading
import time
from collections import Counter


def guess(
    port: int,
    source: str,
    context: ssl.SSLContext,
    until: float,
    seen: Counter[str],
    lock: threading.Lock,
) -> None:
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=10, context=context, source_address=(source, 0)
    )
    while time.monotonic() < until:
        token = base64.b64encode(f"mallory:{secrets.token_hex(8)}".encode()).decode()
        try:
            connection.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
            response = connection.getresponse()
            response.read()
            status = str(response.status)
        except (OSError, http.client.HTTPException) as error:
            status = type(error).__name__
            connection.close()  # opened again by the next request
        with lock:
            seen[status] += 1
    connection.close()


def main(port: str, seconds: str, connections: str = "64", addresses: str = "4") -> None:
    # One context for all: the guesser pays for what it sends, not for loading CAs 64 times.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    until = time.monotonic() + float(seconds)
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    threads = [
        threading.Thread(
            target=guess,
            args=(int(port), f"127.0.0.{2 + n % int(addresses)}", context, until, seen, lock),
        )
        for n in range(int(connections))
    ]
    for thread in threads:
        thread.start()
    print("flooding", flush=True)
    for thread in threads:
        thread.join()
    times = os.times()
    statuses = " ".join(f"{status}={count}" for status, count in sorted(seen.items()))
    print(f"requests={seen.total()} cpu_s={times.user + times.system:.2f} {statuses}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
