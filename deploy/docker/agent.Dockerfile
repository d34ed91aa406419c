# laggard-agent: the node agent alone (nvidia-ml-py + httpx, no server dependencies).
#   docker build -f deploy/docker/agent.Dockerfile -t laggard-agent:0.1.0 .
# The NVIDIA container runtime supplies libnvidia-ml.so.1 at run time (Kubernetes:
# runtimeClassName nvidia; Docker: --gpus all or --runtime nvidia); `--simulate H100:8` needs none.
FROM python:3.11.12-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# setuptools needs every package directory the project lists (pyproject.toml), server/ and
# migrations/ included; the server's dependencies are not installed, so it cannot run here.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY server/ server/
COPY migrations/ migrations/
RUN pip install --no-cache-dir . \
    && cd / && rm -rf /src

# A fixed UID so that Kubernetes' runAsNonRoot can check it (deploy/kubernetes/base/agent.yaml), and
# the spool's default directory (docs/agent.md), writable by it.
RUN groupadd --system --gid 10001 laggard \
    && useradd --system --uid 10001 --gid laggard --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin laggard \
    && install -d -o laggard -g laggard -m 0750 /var/lib/laggard-agent
USER 10001:10001
WORKDIR /

EXPOSE 9401
CMD ["laggard-agent"]
