"""A Prometheus stand-in for a fleet of N nodes, for bench/fleet_refresh_cost.py: the tests'
(tests/helpers/fleet/fakeprom.py), which answers gpuwatch's queries as a server scraping
the nodes would (narrowed ones included), serving 89 % gpuwatch daemons exporting their
node's figures, 10 % dcgm-exporters (the tests' page: 4 A100s) and 1 % targets whose
scrapes fail. Beside Prometheus's API:

    /advance?step=K   its clock at refresh K (2 s apart), an eighth of the nodes scraped
                      since refresh K-1 (each every 16 s)
    /bytes            the bytes of answers sent since the last time it was asked

Run: python bench/fleet_standin.py NODES   (prints its URL, serves until killed)
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import urllib.parse
from collections.abc import Iterator

from gpuwatch.fleet.exposition import Sample
from tests.helpers.fleet import fakeprom
from tests.helpers.fleet.fakeprom import FakePrometheus, FakeTarget, with_node_figures
from tests.helpers.fleet.servers import Reply, fixture, serving

NOW = fakeprom.NOW
REFRESH_S = 2.0
SCRAPED_EVERY = 8
"""Refreshes between two scrapes of a node (16 s at the table's 2 s)."""
_PARSE = fakeprom.parse_exposition


@functools.lru_cache(maxsize=4096)
def _parsed(text: str, prefixes: tuple[str, ...]) -> tuple[Sample, ...]:
    return tuple(_PARSE(text, prefixes))


def _parse_once(text: str, prefixes: tuple[str, ...]) -> Iterator[Sample]:
    """Each page parsed once, not at every query: the stand-in's CPU is not what is
    measured, but it shares the machine."""
    return iter(_parsed(text, prefixes))


def fleet(nodes: int) -> list[FakeTarget]:
    daemon = fixture("gpuwatch_node.prom").decode()
    # Its snapshot time after every scrape: a node's age is its scrape's.
    daemon = daemon.replace("1.7954727494912333e+09", repr(NOW + 1e6))
    dcgm = fixture("dcgm_node.prom").decode()
    targets = []
    for number in range(nodes):
        host, name = f"10.{number // 250}.{number % 250}.1", f"node-{number:05}"
        if number % 100 == 99:
            targets.append(FakeTarget("dcgm", f"{host}:9400", "", up=False))
        elif number % 10 == 9:
            targets.append(FakeTarget("dcgm", f"{host}:9400", dcgm.replace("dgx-a100-03", name)))
        else:
            page = daemon.replace("gpu-node-07", name)
            targets.append(with_node_figures(FakeTarget("gpuwatch", f"{host}:19400", page)))
    return targets


def main() -> None:
    fakeprom.parse_exposition = _parse_once  # type: ignore[assignment]
    prometheus = FakePrometheus(fleet(int(sys.argv[1])))
    sent = [0]

    def route(path: str, headers: dict[str, str]) -> Reply:
        url = urllib.parse.urlsplit(path)
        if url.path == "/advance":
            step = int(dict(urllib.parse.parse_qsl(url.query))["step"])
            prometheus.now = NOW + step * REFRESH_S
            for number, target in enumerate(prometheus.targets):
                if number % SCRAPED_EVERY == step % SCRAPED_EVERY:
                    scraped = dataclasses.replace(target, scraped_at=prometheus.now - 0.5)
                    prometheus.targets[number] = scraped
            return Reply(b"ok")
        if url.path == "/bytes":
            answer, sent[0] = sent[0], 0
            return Reply(str(answer).encode())
        reply = prometheus(path, headers)
        sent[0] += len(reply.body)
        return reply

    with serving(route) as url:
        print(url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
