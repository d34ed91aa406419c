# laggard server (the collector) and the rest of the `laggard` command line (migrate, k8s-sync,
# slurm-sync, hints, stragglers).
#   docker build -f deploy/docker/collector.Dockerfile -t laggard-collector:0.1.0 .
FROM python:3.11.12-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY server/ server/
COPY migrations/ migrations/
RUN pip install --no-cache-dir '.[server]' \
    && cd / && rm -rf /src

# A fixed UID so that Kubernetes' runAsNonRoot can check it (deploy/kubernetes/base/collector.yaml).
# The working directory is where a SQLite laggard.db would go when no LAGGARD_DATABASE_URL is set.
RUN groupadd --system --gid 10001 laggard \
    && useradd --system --uid 10001 --gid laggard --no-create-home --home-dir /var/lib/laggard --shell /usr/sbin/nologin laggard \
    && install -d -o laggard -g laggard -m 0750 /var/lib/laggard
USER 10001:10001
WORKDIR /var/lib/laggard

EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["laggard", "server", "--host", "0.0.0.0"]
