"""Slow clients for the abuse checks: COUNT connections that each send one byte every 2 s.

    python bench/slow_clients.py unix SOCKET_PATH COUNT
    python bench/slow_clients.py tcp PORT COUNT       # from 127.0.0.2, to 127.0.0.1:PORT

Each comes back as soon as it is let go. Prints `flooding` once all are started, then runs
for an hour or until killed. Used by bench/abuse_api.py and tests/abuse/test_daemon_abuse.py.
"""

import socket
import sys
import threading
import time


def slow_client(kind: str, address: str) -> None:
    while True:
        try:
            if kind == "unix":
                client = socket.socket(socket.AF_UNIX)
                client.connect(address)
            else:
                client = socket.socket()
                client.bind(("127.0.0.2", 0))  # another machine's address, as the daemon sees it
                client.connect(("127.0.0.1", int(address)))
            while True:
                client.send(b"G")
                time.sleep(2)
        except OSError:
            time.sleep(0.2)


def main(kind: str, address: str, count: str) -> None:
    for _ in range(int(count)):
        threading.Thread(target=slow_client, args=(kind, address), daemon=True).start()
    print("flooding", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:4])
