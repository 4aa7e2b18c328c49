"""Slow clients for the abuse checks: COUNT connections that hold the daemon's slots.

    python bench/slow_clients.py unix SOCKET_PATH COUNT
    python bench/slow_clients.py tcp PORT COUNT       # from 127.0.0.2, to 127.0.0.1:PORT
    python bench/slow_clients.py idle PORT COUNT      # from 127.0.0.2 to 127.0.0.9 in turn

`unix` and `tcp` clients send one byte every 2 s; `idle` ones send nothing at all. Each comes
back as soon as it is let go. Prints `flooding` once all are connected (or have tried), then
runs for an hour or until killed. Used by bench/abuse_api.py, bench/abuse_endpoint.py and
tests/abuse/test_daemon_abuse.py.
"""

import socket
import sys
import threading
import time

IDLE_SOURCES = [f"127.0.0.{n}" for n in range(2, 10)]


def connect(kind: str, address: str, number: int) -> socket.socket:
    if kind == "unix":
        client = socket.socket(socket.AF_UNIX)
        client.connect(address)
        return client
    # other machines' addresses, as the daemon sees them
    source = "127.0.0.2" if kind == "tcp" else IDLE_SOURCES[number % len(IDLE_SOURCES)]
    return socket.create_connection(("127.0.0.1", int(address)), source_address=(source, 0))


def slow_client(kind: str, address: str, number: int, started: threading.Barrier) -> None:
    first = True
    while True:
        try:
            with connect(kind, address, number) as client:
                if first:
                    first = False
                    started.wait()
                if kind == "idle":
                    while client.recv(4096):
                        pass  # a word from the daemon (503): wait for it to close
                while kind != "idle":
                    client.send(b"G")
                    time.sleep(2)
        except OSError:
            if first:
                first = False
                started.wait()
        time.sleep(0.2)


def main(kind: str, address: str, count: str) -> None:
    started = threading.Barrier(int(count) + 1)
    for number in range(int(count)):
        threading.Thread(
            target=slow_client, args=(kind, address, number, started), daemon=True
        ).start()
    started.wait()
    print("flooding", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:4])
