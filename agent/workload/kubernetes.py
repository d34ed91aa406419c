"""Pod UID (from a cgroup path) → namespace, pod name, job and container names, from a PodList.

The list comes from the API server, this node's pods only
(`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>&resourceVersion=0`, served from the API
server's watch cache), with the pod's service-account token; any URL that answers a PodList
works (the kubelet's own /pods, for instance). httpx only: no Kubernetes client, no gRPC.

Listing happens off the sampling thread (agent.workload.background): a lookup answers from
the last list at once, and asks for a new list when it meets a pod UID the list lacks, or
when the list is older than `refresh_s`, at most once every `min_relist_s`. A failed list
keeps the previous one and is counted; a pod not (yet) listed is answered None and counted.

The job a pod belongs to is, first found wins: the label (or, for Volcano, also the
annotation) of JOB_LABELS in order; then the controller owner reference (a ReplicaSet's
pod-template-hash suffix removed, so a Deployment's pods give the Deployment); then the
app.kubernetes.io/instance label.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from agent.workload.background import Worker

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Workload-level names first: a JobSet's pods also carry their child Job's batch label.
JOB_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "leaderworkerset.sigs.k8s.io/name",
    "batch.kubernetes.io/job-name",
    "job-name",  # what Jobs set before batch.kubernetes.io/job-name (Kubernetes < 1.27), still set
)
INSTANCE_LABEL = "app.kubernetes.io/instance"
# A static pod's cgroup carries the kubelet's UID for it (the config hash); the API server's
# mirror pod has a UID of its own and the hash in this annotation.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str | None
    name: str | None
    job: str | None
    containers: Mapping[str, str] = field(default_factory=dict)  # container id (64 hex) → container name


def job_of(metadata: Mapping[str, Any]) -> str | None:
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    for key in JOB_LABELS:
        value = labels.get(key) or annotations.get(key)
        if value:
            return str(value)
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("controller") and owner.get("name"):
            name = str(owner["name"])
            suffix = labels.get("pod-template-hash")
            if owner.get("kind") == "ReplicaSet" and suffix and name.endswith(f"-{suffix}"):
                name = name[: -len(suffix) - 1]
            return name
    instance = labels.get(INSTANCE_LABEL)
    return str(instance) if instance else None


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """container id → name from the pod status ("containerd://<id>", "cri-o://<id>", "docker://<id>")."""
    out: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            cid, name = cs.get("containerID"), cs.get("name")
            if cid and name:
                out[str(cid).rpartition("://")[2]] = str(name)
    return out


def pods_from_list(body: Mapping[str, Any]) -> dict[str, PodInfo]:
    """A PodList as {uid: PodInfo}, each static pod also under its config hash."""
    pods: dict[str, PodInfo] = {}
    for item in body.get("items") or []:
        meta = item.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            continue
        info = PodInfo(uid=str(uid), namespace=meta.get("namespace"), name=meta.get("name"), job=job_of(meta),
                       containers=_container_ids(item.get("status") or {}))
        pods[info.uid] = info
        mirror = (meta.get("annotations") or {}).get(MIRROR_ANNOTATION)
        if mirror:
            pods.setdefault(str(mirror), info)
    return pods


def api_server_pods_url(api: str, node: str) -> str:
    return f"{api.rstrip('/')}/api/v1/pods?fieldSelector={quote(f'spec.nodeName={node}', safe='')}&resourceVersion=0"


def in_cluster_api(env: Mapping[str, str] | None = None) -> str | None:
    """https://KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, or None outside a pod."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _verify(url: str, ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext | bool:
    """The cluster CA for an https:// URL; the system's when there is none (then lists fail, counted)."""
    if not (ca_file and url.startswith("https://") and os.path.exists(ca_file)):
        return True
    try:
        return ssl.create_default_context(cafile=os.fspath(ca_file))
    except (OSError, ssl.SSLError) as exc:
        log.warning("cannot use %s as the API server's CA (%s): trying the system's", ca_file, exc)
        return True


class KubePods:
    """lookup(pod_uid) → PodInfo | None, from this node's pod list (see the module docstring).

    `errors` counts "k8s_list_failed" (a list that failed: connection, HTTP status, bad JSON)
    and "k8s_pod_unknown" (a lookup answered None)."""

    def __init__(self, url: str, *, token_file: str | os.PathLike[str] | None = None, ca_file: str | os.PathLike[str] | None = None,
                 min_relist_s: float = 5.0, refresh_s: float = 300.0, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.url = url
        self.token_file = os.fspath(token_file) if token_file else None
        self.min_relist_s = min_relist_s
        self.refresh_s = refresh_s
        self._clock = clock
        self._client = httpx.Client(verify=_verify(url, ca_file), timeout=timeout_s, headers={"Accept": "application/json"})
        self._pods: dict[str, PodInfo] = {}
        self._listed_at: float | None = None  # last list that worked
        self._asked_at: float | None = None  # last list asked for
        self._failing = False
        self.lists = 0
        self.errors = {"k8s_list_failed": 0, "k8s_pod_unknown": 0}
        self._worker = Worker(lambda _key: self.relist(), name="k8s-pods", background=background)

    @classmethod
    def in_cluster(cls, node: str, *, env: Mapping[str, str] | None = None, **kwargs: Any) -> KubePods | None:
        """The API server and service account of the pod this runs in; None outside a pod."""
        api = in_cluster_api(env)
        if api is None or not node:
            return None
        return cls(api_server_pods_url(api, node), token_file=SERVICE_ACCOUNT / "token", ca_file=SERVICE_ACCOUNT / "ca.crt", **kwargs)

    def lookup(self, pod_uid: str) -> PodInfo | None:
        pod = self._pods.get(pod_uid)
        now = self._clock()
        due = pod is None or self._listed_at is None or now - self._listed_at >= self.refresh_s
        if due and (self._asked_at is None or now - self._asked_at >= self.min_relist_s):
            self._asked_at = now
            self._worker.request("list")
            pod = self._pods.get(pod_uid)  # filled in already when the worker runs inline
        if pod is None:
            self.errors["k8s_pod_unknown"] += 1
        return pod

    def relist(self) -> bool:
        """List the pods now (normally the worker's job); False when the list failed."""
        try:
            headers = {}
            if self.token_file:
                with open(self.token_file) as f:  # read each time: projected tokens are rotated in place
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            reply = self._client.get(self.url, headers=headers)
            if reply.status_code != 200:
                raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
            pods = pods_from_list(reply.json())
        except Exception as exc:  # OSError, httpx.HTTPError, ValueError (JSON), RuntimeError
            self.errors["k8s_list_failed"] += 1
            if not self._failing:
                log.warning("listing this node's pods failed (%s); pod fields stay null until a list works", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("listing this node's pods works again")
        self._failing = False
        self._pods = pods
        self._listed_at = self._clock()
        self.lists += 1
        return True

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return self._worker.wait_idle(timeout)

    def close(self) -> None:
        self._worker.close()
        self._client.close()
