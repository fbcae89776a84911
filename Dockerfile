# The agentsessions host as a container: `agentsessions serve` on 0.0.0.0:50051, the SQLite journal on
# the /var/lib/agentsessions volume, run as an unprivileged user, health-checked over grpc.health.v1.
#
#   docker build -t agentsessions .                       # python:3.11-slim, packages from PyPI
#   docker run -p 50051:50051 -v agentsessions:/var/lib/agentsessions -v ./tokens.json:/etc/agentsessions/tokens.json \
#     agentsessions serve --auth-tokens /etc/agentsessions/tokens.json
#   docker run -p 127.0.0.1:50051:50051 agentsessions serve --insecure-allow-unauthenticated   # a local trial
#
# 0.0.0.0 is not loopback, so `serve` refuses to start without --auth-tokens (or mutual TLS) unless it
# is given --insecure-allow-unauthenticated (or AGENTSESSIONS_INSECURE_ALLOW_UNAUTHENTICATED=true):
# the image never trusts every caller on its own.
#
# Offline (no index reachable from the build): put every wheel in deploy/wheels/ first
# (scripts/container-wheels.sh) and build with --build-arg PIP_INSTALL_ARGS="--no-index" and
# --build-arg BASE=<a local image with python3 and python3-venv>; see README "Container".
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG PIP_INSTALL_ARGS=""
WORKDIR /src
COPY deploy/wheels/ /wheels/
COPY sdk/ sdk/
COPY harnesses/ harnesses/
COPY host/ host/
# One virtual environment holds the host, the SDK and the harnesses; the runtime stage copies it whole.
RUN python3 -m venv /opt/agentsessions \
 && /opt/agentsessions/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --find-links /wheels ${PIP_INSTALL_ARGS} ./sdk ./harnesses ./host \
 && /opt/agentsessions/bin/agentsessions --help >/dev/null

FROM ${BASE}
# A fixed uid/gid so volumes and Kubernetes securityContext (runAsUser/fsGroup 10001) line up;
# /workspace is where deploy/ mounts the coding harness's workspace (a new volume takes its owner).
RUN groupadd --system --gid 10001 agentsessions \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/agentsessions --no-create-home \
      --shell /usr/sbin/nologin agentsessions \
 && mkdir -p /var/lib/agentsessions /workspace \
 && chown 10001:10001 /var/lib/agentsessions /workspace
COPY --from=build /opt/agentsessions /opt/agentsessions
ENV PATH=/opt/agentsessions/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    AGENTSESSIONS_LISTEN=0.0.0.0:50051 \
    AGENTSESSIONS_JOURNAL=/var/lib/agentsessions/agentsessions.db \
    AGENTSESSIONS_SERVER=127.0.0.1:50051
VOLUME ["/var/lib/agentsessions"]
WORKDIR /var/lib/agentsessions
USER 10001:10001
EXPOSE 50051
HEALTHCHECK --interval=15s --timeout=6s --start-period=20s --retries=3 \
  CMD ["agentsessions", "health", "--quiet"]
ENTRYPOINT ["agentsessions"]
CMD ["serve"]
