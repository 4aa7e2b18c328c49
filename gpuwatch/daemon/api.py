"""The daemon's read-only HTTP API, served on its Unix socket.

    GET /v1/snapshot               the latest snapshot (the JSON of `gpuwatch status --json`)
    GET /v1/history?last=10m       per-GPU series of memory, utilization, temperature and
    GET /v1/history?since=UNIX         power (default: the last 10 minutes; at most
                                       20,000 samples, the newest, and `truncated` says so)
    GET /v1/leases                 who holds which GPU (from the lease directory)
    GET /v1/health                 whether sampling works, and how big the history is
    GET /v1/training               training processes watched by gpuwatch.torch.watch()
    GET /v1/jobs                   the scheduler's jobs on this node and their GPUs, and how
                                       long each held GPU has been idle (200 while unknown too)
    GET /v1/jobs/seen?job_id=ID    what the daemon remembers of job ID: the GPUs it held
                                       here and when it was seen (`seen: false` if never)
    GET /metrics                   Prometheus metrics (also over TCP, with `--listen`)
    GET /-/healthy                 200 while the daemon runs (also over TCP)
    GET /-/ready                   200 while a current snapshot is served, else 503 (also
                                       over TCP): Prometheus's own health endpoints

Anything else is 404, and every method but GET and HEAD is 405: nothing here
changes state. Every answer but /metrics and /-/* is JSON. A snapshot is served only
while it is current: when sampling stalls or fails as a whole, /v1/snapshot
and /v1/health answer 503, and the metrics mark every GPU down. A route is one
entry in `Api.routes`: a method that takes the query and returns a `Response`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST

from gpuwatch._version import __version__
from gpuwatch.daemon.job_watch import JobSettings, JobWatch
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.settings import Settings
from gpuwatch.daemon.training_series import TrainingView, training_body
from gpuwatch.daemon.view import NO_REPORTS, View
from gpuwatch.daemon.wire import Response, error_response, json_response, text_response
from gpuwatch.errors import InvalidValueError
from gpuwatch.jobs.job_table import table_record
from gpuwatch.jobs.sightings import sighting_record
from gpuwatch.leases.directory import LeaseDir, LeaseFiles
from gpuwatch.models import SNAPSHOT_FORMAT_VERSION
from gpuwatch.paths import served_simulation
from gpuwatch.request import Waiter
from gpuwatch.sampling.poller import Poller, PollState
from gpuwatch.units import parse_duration

log = logging.getLogger("gpuwatch.daemon")

DEFAULT_HISTORY_WINDOW_S = 600.0
MAX_HISTORY_POINTS = 20_000
STALE_AFTER_HEADER = "X-Gpuwatch-Stale-After"
_READ_ONLY = ("Allow", "GET, HEAD")
TCP_PATHS = ("/metrics", "/-/healthy", "/-/ready")
Query = dict[str, str]
Route = Callable[[Query], Response]


def stale_after_s(interval_s: float) -> float:
    """How old a snapshot may be and still pass for current."""
    return max(5 * interval_s, 10.0)


def stale_reason(poller: Poller, state: PollState | None = None) -> str | None:
    """Why the latest snapshot (of `state`, by default the poller's now) must not be served
    as current; `None` when it may be, or when there is none yet."""
    state = state or poller.state
    if (stalled_s := poller.stalled_s) is not None:
        return f"sampling has made no progress for {stalled_s:.0f}s (a driver call hangs?)"
    if state.snapshot is None:
        return None
    age_s = time.monotonic() - state.sampled_at
    if state.error is not None:
        return f"sampling fails ({state.error}); the last snapshot is {age_s:.0f}s old"
    if age_s > stale_after_s(poller.interval_s):
        return f"the last snapshot is {age_s:.0f}s old"
    return None


class Api:
    """Answers each route from one view of the poller's state, taken for that request; no
    HTTP in here, so it is tested directly."""

    def __init__(self, poller: Poller, settings: Settings, jobs: JobWatch | None = None) -> None:
        self.poller = poller
        self.settings = settings
        self.jobs = jobs or JobWatch(JobSettings(engine="off"))
        self._training = TrainingView()
        self._started = time.monotonic()
        self._snapshot_cache: tuple[int, Response] | None = None
        self._cache_lock = threading.Lock()
        self._history_slots = threading.BoundedSemaphore(2)
        self.routes: dict[str, Route] = {
            "/v1/snapshot": self.snapshot,
            "/v1/history": self.history,
            "/v1/leases": self.leases,
            "/v1/health": self.health,
            "/metrics": self.metrics,
            "/v1/training": self.training,
            "/v1/jobs": self.job_table,
            "/v1/jobs/seen": self.job_seen,
            "/-/healthy": self.healthy,
            "/-/ready": self.ready,
        }

    def route(self, method: str, target: str) -> Response:
        url = urlsplit(target)
        answer = self.routes.get(url.path.rstrip("/") or "/")
        if answer is None:
            return json_response(
                404, {"error": f"no such path: {url.path[:200]}", "paths": [*self.routes]}
            )
        if method not in ("GET", "HEAD"):
            return error_response(405, f"{method} is not allowed: this API only reads", _READ_ONLY)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            return answer(query)
        except Exception:  # a fault of the daemon's: the client still gets an answer
            log.exception("answering %s failed", url.path)
            return error_response(500, "the daemon failed to answer; see its log")

    def metrics_only(self, method: str, target: str) -> Response:
        """The TCP listener's routes: `/metrics` and Prometheus's health endpoints alone; the
        rest stays on the machine."""
        if (path := urlsplit(target).path) not in TCP_PATHS:
            return error_response(404, f"only {', '.join(TCP_PATHS)} are served over TCP")
        return self.route(method, path)

    def view(self, *, leases: bool = False, training: bool = False) -> View:
        """What the daemon knows now, for one request: leases and training reports only when
        `leases` and `training` ask for them (leases only while the snapshot is current)."""
        state = self.poller.state
        stale = stale_reason(self.poller, state)
        found, waiters = LeaseFiles([]), []
        if leases and state.snapshot is not None and stale is None:
            found, waiters = self._lease_files(), self._waiters()
        return View(
            state,
            stale,
            tuple(found.leases),
            found.skipped,
            tuple(waiters),
            self._training.reports() if training else NO_REPORTS,
            self.settings.node_name,
            self.jobs.now(state.snapshot),
            self.settings.simulated,
        )

    def snapshot(self, query: Query) -> Response:
        state = (view := self.view()).state
        if (reason := view.stale) is not None:
            return error_response(503, reason)
        if state.snapshot is None:
            return json_response(503, {"error": "no snapshot yet", "last_error": state.error})
        with self._cache_lock:  # 50 clients polling at 10 Hz share one encoding per sample
            if self._snapshot_cache is None or self._snapshot_cache[0] != state.samples:
                stale_after = (STALE_AFTER_HEADER, f"{stale_after_s(self.poller.interval_s):g}")
                body = {"format_version": SNAPSHOT_FORMAT_VERSION, **state.snapshot.to_dict()}
                response = json_response(200, body, stale_after)
                self._snapshot_cache = (state.samples, response)
            return self._snapshot_cache[1]

    def history(self, query: Query) -> Response:
        try:
            if "since" in query:
                since = float(query["since"])
                if not math.isfinite(since):  # NaN would match every sample, inf none
                    raise ValueError(query["since"])
                back_s = time.time() - since
            else:
                back_s = parse_duration(query.get("last", "600"))
            # Samples are selected on the monotonic clock: a step of the wall clock
            # changes neither which nor how many are "the last 2 s".
            start = time.monotonic() - back_s
        except (ValueError, InvalidValueError):
            return error_response(400, "give since=UNIX_TIME or last=DURATION (e.g. 10m)")
        if not self._history_slots.acquire(blocking=False):
            return error_response(503, "two history answers are being built; ask again")
        try:
            series, truncated = self.poller.history_since(start, MAX_HISTORY_POINTS)
            return json_response(
                200,
                {
                    "interval_s": self.poller.interval_s,
                    "truncated": truncated,
                    "gpus": [msgspec.to_builtins(s) for s in series],
                },
            )
        finally:
            self._history_slots.release()

    def leases(self, query: Query) -> Response:
        found = self._lease_files()  # whether the snapshot is current or not
        return json_response(
            200,
            {"leases": [lease.to_dict() for lease in found.leases], "skipped": found.skipped},
        )

    def health(self, query: Query) -> Response:
        view = self.view()
        state, snapshot, stale = view.state, view.snapshot, view.stale
        held, capacity, nbytes = self.poller.history_size()
        faulty = [gpu.index for gpu in snapshot.gpus if not gpu.ok] if snapshot else []
        if self.poller.stalled_s is not None:
            status = "stalled"
        elif snapshot is None:
            status = "starting" if state.error is None else "failing"
        elif stale is not None:
            status = "failing"
        else:
            status = "degraded" if faulty else "ok"
        return json_response(
            200 if snapshot is not None and stale is None else 503,
            {
                "status": status,
                "version": __version__,
                "pid": os.getpid(),
                "backend": "sim" if self.settings.simulated else self.settings.backend,
                "simulated": self.settings.simulated,
                "interval_s": self.poller.interval_s,
                "uptime_s": round(time.monotonic() - self._started, 1),
                "samples": state.samples,
                "last_attempt_age_s": round(time.monotonic() - state.attempted_at, 3),
                "last_error": stale or state.error,
                "gpus": len(snapshot.gpus) if snapshot else 0,
                "gpus_with_errors": faulty,
                "history": {
                    "samples": held,
                    "capacity": capacity,
                    "bytes": nbytes,
                    "retention_s": self.poller.history_s,
                },
            },
        )

    def training(self, query: Query) -> Response:
        view = self.view(training=True)
        return json_response(200, training_body(view.snapshot, view.training))

    def job_table(self, query: Query) -> Response:
        """`table_record` of the jobs (`known: false` and `error` while unknown), with the
        idle seconds of each held GPU by uuid, the window after which that is waste, and
        whether a scheduler is read at all (a client asks its own where none is)."""
        jobs = self.view().jobs
        body = table_record(jobs.table, error=jobs.error)
        body["allocated_idle_s"] = {
            uuid: round(seconds, 1) for uuid, seconds in jobs.allocated_idle_s.items()
        }
        body["idle_window_s"] = jobs.idle_window_s
        body["reading"] = jobs.reading
        return json_response(200, body)

    def job_seen(self, query: Query) -> Response:
        """What the daemon remembers of job `job_id` (kept as long as its history), and
        since when it remembers jobs at all."""
        job_id = query.get("job_id", "")
        if not job_id or len(job_id) > 64 or not job_id.isprintable():
            return error_response(400, "give job_id=ID (at most 64 printable characters)")
        sightings = self.jobs.sightings
        seen = sightings.seen(job_id)
        body = {
            "job_id": job_id,
            "seen": seen is not None,
            "job": sighting_record(seen) if seen is not None else None,
            "memory_since": sightings.since,
            "keep_s": sightings.keep_s,
            "reading": self.jobs.reading,
        }
        return json_response(200, body)

    def metrics(self, query: Query) -> Response:
        return Response(200, CONTENT_TYPE_LATEST, exposition(self.view(leases=True, training=True)))

    def healthy(self, query: Query) -> Response:
        return text_response(200, "gpuwatch daemon is healthy.\n")

    def ready(self, query: Query) -> Response:
        """Ready while the snapshot may be served as current, as `gpuwatch_sampling_up`."""
        view = self.view()
        if view.current:
            return text_response(200, "gpuwatch daemon is ready.\n")
        why = view.stale or f"no sample yet ({view.state.error or 'starting'})"
        return text_response(503, f"gpuwatch daemon is not ready: {why}\n")

    def _lease_files(self) -> LeaseFiles:
        lease_dir = self._lease_dir()
        return lease_dir.read() if lease_dir is not None else LeaseFiles([])

    def _waiters(self) -> list[Waiter]:
        lease_dir = self._lease_dir()
        return lease_dir.waiting_before(None) if lease_dir is not None else []

    def _lease_dir(self) -> LeaseDir | None:
        """The leases of this node: a simulated node's are its clients' own, kept apart."""
        settings = self.settings
        simulation = served_simulation(settings.socket_path) if settings.simulated else None
        return LeaseDir.read_only(simulation=simulation)
