"""Ships samples to the collector: batched, gzipped, retried, never blocking the sampler.

Samples wait in a bounded queue (oldest dropped first, counted) until a batch is full or
its oldest sample is `max_delay` seconds old. A batch leaves the queue only once the
collector has answered: 2xx (stored) or a permanent rejection (400/413/422, dropped and
logged). A 415 switches gzip off for later requests. A 401, 403 or 409 is a configuration error
(agent/refusal.py): the samples wait, the log says once what to fix, and the push is retried
every `auth_retry` seconds. Anything else (429, 5xx, connection errors) is retried, without
limit while the agent runs, after a capped exponential backoff with jitter (honouring
Retry-After up to the cap). Each retry re-reads
the queue head, so samples that aged out while the collector was away are not resent.

An agent given no cluster (cluster=None) asks the collector which cluster its token is bound
to (GET /api/v1/tokens/self) before its first push, and pushes as that one.

`SampleQueue` is the seam between the pusher and where samples wait: MemoryQueue (bounded,
in memory, lost on exit) or agent/spool/'s DiskSpool (bounded, on disk, survives a restart).
"""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import httpx

from agent import __version__
from agent.refusal import ProblemLog, hint, needs_binding, refusal_of
from agent.sample import Sample, build_batch, json_default

log = logging.getLogger(__name__)

PERMANENT_STATUSES = frozenset({400, 413, 422})
# 409: a GPU UUID held by another live node (server/store/ids.py); resolved by people, or by time.
REFUSED_STATUSES = frozenset({401, 403, 409})
# The collector answers these when it may answer differently soon; anything else from
# GET /api/v1/tokens/self (404, 405, 501: an older collector) means it will not say.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
SAMPLES_PATH = "/api/v1/samples"
SELF_PATH = "/api/v1/tokens/self"
DEFAULT_CLUSTER = "default"
KEEPALIVE_EXPIRY_S = 60.0


class SampleQueue(Protocol):
    """FIFO of (seq, sample); seqs increase; ack(seq) removes everything up to seq."""

    dropped: int
    durable: bool  # what it holds survives a restart of the agent (DiskSpool)

    def put(self, sample: Sample) -> None: ...
    def peek(self, n: int) -> list[tuple[int, Sample]]: ...

    def peek_encoded(self, n: int) -> list[tuple[int, bytes]] | None:
        """The head with each sample as the JSON a push carries, if the queue keeps them so
        (DiskSpool: sent without encoding them again); None: use peek()."""
        ...

    def ack(self, upto_seq: int) -> None: ...
    def __len__(self) -> int: ...


class MemoryQueue:
    durable = False

    def __init__(self, maxlen: int = 720) -> None:
        if maxlen < 1:
            raise ValueError("queue length must be at least 1")
        self._items: collections.deque[tuple[int, Sample]] = collections.deque()
        self._maxlen = maxlen
        self._next_seq = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, sample: Sample) -> None:
        with self._lock:
            if len(self._items) >= self._maxlen:
                self._items.popleft()
                self.dropped += 1
            self._items.append((self._next_seq, sample))
            self._next_seq += 1

    def peek(self, n: int) -> list[tuple[int, Sample]]:
        with self._lock:
            return list(itertools.islice(self._items, n))

    def peek_encoded(self, n: int) -> None:
        return None  # samples are kept as objects

    def ack(self, upto_seq: int) -> None:
        with self._lock:
            while self._items and self._items[0][0] <= upto_seq:
                self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class PushStats:
    sent_batches: int = 0
    sent_samples: int = 0
    rejected_batches: int = 0
    rejected_samples: int = 0
    failed_attempts: int = 0
    refused_attempts: int = 0  # 401/403: also counted in failed_attempts


class Pusher:
    def __init__(
        self,
        collector_url: str,
        *,
        node: str,
        cluster: str | None = DEFAULT_CLUSTER,
        labels: dict[str, str] | None = None,
        agent_info: dict[str, str | None] | None = None,
        token: str | None = None,
        token_file: str | None = None,
        ca_bundle: str | None = None,
        batch_size: int = 4,
        max_delay: float = 10.0,
        queue: SampleQueue | None = None,
        timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        compresslevel: int = 6,
        auth_retry: float = 60.0,
        on_cluster: Callable[[str], None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        self.url = collector_url.rstrip("/") + SAMPLES_PATH
        self.self_url = collector_url.rstrip("/") + SELF_PATH
        # None: not known yet, asked of the collector (the cluster the token is bound to).
        self.node, self.cluster = node, cluster
        self.learns_cluster, self.on_cluster = cluster is None, on_cluster
        self.labels = dict(labels or {})
        self.agent_info = dict(agent_info or {"version": __version__, "driver": None, "cuda": None})
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.queue: SampleQueue = queue if queue is not None else MemoryQueue()
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.compresslevel = compresslevel
        self.auth_retry = auth_retry
        self._token, self._token_file = token, token_file
        self._refusals = ProblemLog(log)
        self.stats = PushStats()
        self.use_gzip = True
        headers = {"Content-Type": "application/json", "User-Agent": f"laggard-agent/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # https:// is verified against the system CAs, or against ca_bundle (a private CA).
        verify = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else True
        # Idle connections kept 60 s, so that pushes every ~10 s reuse one; shorter than the
        # collector keeps them (75 s, server/serve.py), so the agent never reuses one the
        # collector is closing. A proxy that closes sooner costs a retry, nothing else.
        self._client = httpx.Client(headers=headers, timeout=timeout, verify=verify,
                                    limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0  # consecutive transient failures of the current head batch

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    # --- producer side ----------------------------------------------------------------

    def submit(self, sample: Sample) -> None:
        """Queue one sample; never blocks on the network."""
        self.queue.put(sample)
        with self._wake:
            self._wake.notify()

    # --- sending ----------------------------------------------------------------------

    def encode(self, samples: list[Sample]) -> bytes:
        body = build_batch([], node=self.node, cluster=self.cluster, labels=self.labels,
                           agent_info=self.agent_info)
        # The samples go to json as dataclasses: dataclasses.asdict (build_batch's way)
        # deep-copies every field and was most of the agent's encoding CPU. The output
        # is the same (tests/agent/test_push.py compares it with build_batch).
        body["samples"] = samples
        data = json.dumps(body, separators=(",", ":"), default=json_default).encode()
        return self._compress(data)

    def encode_encoded(self, payloads: list[bytes]) -> bytes:
        """The request body for samples already encoded as JSON (DiskSpool.peek_encoded):
        the same bytes encode() gives for the samples themselves, without encoding them again."""
        body = build_batch([], node=self.node, cluster=self.cluster, labels=self.labels, agent_info=self.agent_info)
        head = json.dumps(body, separators=(",", ":"))
        assert head.endswith('"samples":[]}')  # samples is the last key: splice them in before "]}"
        data = head[:-2].encode() + b",".join(payloads) + b"]}"
        return self._compress(data)

    def _compress(self, data: bytes) -> bytes:
        return gzip.compress(data, self.compresslevel) if self.use_gzip else data

    def send_once(self) -> float | None:
        """Send one batch from the queue head.

        Returns None when the batch is settled (stored, rejected, or nothing to send),
        else the seconds to wait before retrying.
        """
        encoded = self.queue.peek_encoded(self.batch_size)
        head = encoded if encoded is not None else self.queue.peek(self.batch_size)
        if not head:
            return None
        if self._refusals.current is not None:
            self._reload_token()
        if self.cluster is None and (delay := self._learn_cluster()) is not None:
            return delay
        samples = [s for _, s in head]
        last_seq = head[-1][0]
        retry_after: float | None = None
        try:
            content = self.encode_encoded(samples) if encoded is not None else self.encode(samples)
        except (TypeError, ValueError) as exc:  # a bug, not the network: retrying cannot help
            self._settled(last_seq)
            self.stats.rejected_batches += 1
            self.stats.rejected_samples += len(samples)
            log.error("cannot encode %d samples, dropping them: %s", len(samples), exc)
            return None
        headers = {"Content-Encoding": "gzip"} if self.use_gzip else None
        try:
            resp = self._client.post(self.url, content=content, headers=headers)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if 200 <= resp.status_code < 300:
                self._settled(last_seq)
                self.stats.sent_batches += 1
                self.stats.sent_samples += len(samples)
                self._check_accepted(resp, len(samples))
                self._refusals.recovered(f"collector accepts pushes again ({len(self.queue)} samples still waiting)")
                return None
            if resp.status_code == 415 and self.use_gzip:
                # Something on the way refuses gzip: send uncompressed from now on.
                log.warning("collector refused gzip (HTTP 415); sending uncompressed")
                self.use_gzip = False
                return 0.0
            if resp.status_code in REFUSED_STATUSES:
                return self._refused(resp, f"the push of {len(samples)} samples")
            if resp.status_code in PERMANENT_STATUSES:
                self._settled(last_seq)
                self.stats.rejected_batches += 1
                self.stats.rejected_samples += len(samples)
                log.error("collector rejected %d samples with HTTP %d, dropping them: %s",
                          len(samples), resp.status_code, _body_text(resp))
                return None
            reason = f"HTTP {resp.status_code}: {_body_text(resp)}"
            retry_after = _retry_after(resp)
        return self._retry_later(f"push of {len(samples)} samples to {self.url}", reason, retry_after)

    def _retry_later(self, what: str, reason: str, retry_after: float | None) -> float:
        self._failures += 1
        self.stats.failed_attempts += 1
        delay = self._backoff(retry_after)
        log.warning("%s failed (%s); retry %d in %.1fs", what, reason, self._failures, delay)
        return delay

    # --- 401/403 and the token's cluster ----------------------------------------------

    def _learn_cluster(self) -> float | None:
        """Ask the collector which cluster the token is bound to: None once self.cluster is
        set, else the seconds to wait before asking again."""
        what = f"asking {self.self_url} for the token's cluster"
        try:
            resp = self._client.get(self.self_url)
        except httpx.HTTPError as exc:
            return self._retry_later(what, f"{type(exc).__name__}: {exc}", None)
        if resp.status_code in REFUSED_STATUSES:
            return self._refused(resp, "the token")
        if resp.status_code in TRANSIENT_STATUSES:
            return self._retry_later(what, f"HTTP {resp.status_code}: {_body_text(resp)}", _retry_after(resp))
        bound = _json(resp).get("cluster") if resp.status_code == 200 else None
        self.cluster = bound if isinstance(bound, str) and bound else DEFAULT_CLUSTER
        if isinstance(bound, str) and bound:
            log.info("pushing as cluster %s: the cluster the token is bound to", self.cluster)
        else:
            log.info("pushing as cluster %s: the collector names no cluster for the token (HTTP %d from %s)",
                     self.cluster, resp.status_code, self.self_url)
        if self.on_cluster is not None:
            self.on_cluster(self.cluster)
        return None

    def _refused(self, resp: httpx.Response, what: str) -> float:
        """A 401/403: log what to fix (once; agent/refusal.py), keep the samples, retry slowly."""
        refusal = refusal_of(resp.status_code, _json(resp) or resp.text)
        binding = self._binding() if needs_binding(refusal) else None
        fix = hint(refusal, binding, token_sent=bool(self._token), cluster=self.cluster, node=self.node)
        self.stats.failed_attempts += 1
        self.stats.refused_attempts += 1
        reread = " (the token file is read again before each retry)" if self._token_file and refusal.status == 401 else ""
        self._refusals.failing(f"{refusal.status} {fix}",
                               f"collector refused {what} (HTTP {refusal.status}: {refusal.msg}): {fix}{reread}. "
                               f"Samples are kept and sent again every {self.auth_retry:g} s")
        return self.auth_retry * random.uniform(0.8, 1.0)

    def _binding(self) -> dict | None:
        """What the token is bound to, for a refusal's hint; None if the collector does not say."""
        try:
            resp = self._client.get(self.self_url)
        except httpx.HTTPError:
            return None
        return _json(resp) if resp.status_code == 200 else None

    def _reload_token(self) -> None:
        """A token file (a mounted Secret) may be fixed in place: read it again before retrying a refusal."""
        if not self._token_file:
            return
        try:
            token = Path(self._token_file).read_text().strip()
        except OSError:
            return
        if token and token != self._token:
            log.info("token file %s changed: trying the new token", self._token_file)
            self._token = token
            self._client.headers["Authorization"] = f"Bearer {token}"
            if self.learns_cluster:
                self.cluster = None

    def _settled(self, last_seq: int) -> None:
        self.queue.ack(last_seq)
        self._failures = 0

    def _backoff(self, retry_after: float | None) -> float:
        delay = min(self.backoff_max, self.backoff_base * 2 ** (self._failures - 1))
        # Jitter keeps a fleet of agents from retrying in lockstep after a collector restart.
        delay *= random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay

    @staticmethod
    def _check_accepted(resp: httpx.Response, n: int) -> None:
        try:
            accepted = resp.json().get("accepted")
        except (ValueError, AttributeError):
            return
        if accepted is not None and accepted != n:
            log.warning("collector accepted %s of %d samples", accepted, n)

    # --- background thread ------------------------------------------------------------

    def start(self) -> Pusher:
        self._thread = threading.Thread(target=self._run, name=f"pusher-{self.node}", daemon=True)
        self._thread.start()
        return self

    def _wait_left(self) -> float:
        """Seconds until the queued samples should go out (0: now)."""
        if len(self.queue) >= self.batch_size:
            return 0.0
        head = self.queue.peek(1)
        if not head:
            return 1.0
        return max(0.0, head[0][1].ts + self.max_delay - time.time())

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                left = self._wait_left()
                if left > 0:
                    # submit() notifies; the timeout catches a partial batch's max_delay.
                    self._wake.wait(min(left, 1.0))
                    continue
            if self._stop.is_set():
                break
            delay = self.send_once()
            if delay is not None:
                self._stop.wait(delay)

    def flush(self, timeout: float = 5.0) -> bool:
        """Try to send everything queued within `timeout` seconds; True if the queue emptied."""
        deadline = time.monotonic() + timeout
        while len(self.queue) and time.monotonic() < deadline:
            delay = self.send_once()
            if delay is not None:
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        return not len(self.queue)

    def close(self, flush_timeout: float = 5.0) -> None:
        """Stop the thread, make a bounded last attempt to send what is queued, close."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        # Refused (401/403): another try on the way out would be refused too.
        if flush_timeout > 0 and len(self.queue) and self._refusals.current is None:
            if not self.flush(flush_timeout):
                kept = " (kept in the spool for the next start)" if self.queue.durable else ""
                log.warning("exiting with %d unsent samples%s", len(self.queue), kept)
        self._client.close()


def _json(resp: httpx.Response) -> dict:
    """The body as a JSON object, else {}."""
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _body_text(resp: httpx.Response, limit: int = 500) -> str:
    try:
        text = json.dumps(resp.json())
    except ValueError:
        text = resp.text
    return text[:limit]


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff
