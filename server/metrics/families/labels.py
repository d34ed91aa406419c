"""Label names and placeholders that several family groups share."""

GPU_LABELS = ("cluster", "node", "gpu", "uuid", "job_name")
# job_name: the attributed job (issue #15), "" (no label) where none. Not `job`: that is the scrape
# job's label, which honor_labels would let this overwrite. kube-state-metrics names a Job `job_name`.
NO_POD = (None, None, None)  # namespace, pod, container of a GPU no Kubernetes pod is attributed to
NO_WORKLOAD = (NO_POD, "")  # (namespace, pod, container), job of a GPU nothing is attributed to
XID_LAST_HORIZON_S = 3600.0  # laggard_gpu_xid_last_timestamp_seconds: XIDs this recent
