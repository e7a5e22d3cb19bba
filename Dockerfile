# syntax=docker/dockerfile:1
# The Highwater image: one `highwater` entry point for every role (controller, broker,
# coordinator) and every operator tool. `make image` builds it.
# --- build: a virtual environment with highwater and its runtime dependencies ---------
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# A C compiler for the compiled record codec (highwater.records._codec; the image's Python
# carries its headers). Only the build stage has it: the runtime stage copies the venv.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/highwater
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY services ./services
RUN /opt/highwater/bin/pip install --no-compile . \
    && /opt/highwater/bin/python -m compileall -q /opt/highwater/lib \
    && /opt/highwater/bin/highwater --version \
    && /opt/highwater/bin/python -c "import highwater.records as r; assert r.IMPLEMENTATION == 'compiled'"

# --- runtime: the environment alone, run as an unprivileged user ----------------------
FROM python:3.11-slim-bookworm
ARG HIGHWATER_UID=10001
LABEL org.opencontainers.image.title="highwater" \
      org.opencontainers.image.description="A distributed, replicated commit log on Kafka's design, as gRPC services" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid ${HIGHWATER_UID} highwater \
    && useradd --system --uid ${HIGHWATER_UID} --gid highwater --home-dir /var/lib/highwater \
       --shell /usr/sbin/nologin highwater \
    && install -d -o highwater -g highwater -m 0750 /var/lib/highwater
COPY --from=build /opt/highwater /opt/highwater
ENV PATH=/opt/highwater/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HIGHWATER_LOG_LEVEL=INFO
USER ${HIGHWATER_UID}:${HIGHWATER_UID}
WORKDIR /var/lib/highwater
VOLUME ["/var/lib/highwater"]
# broker, controller, coordinator (each role takes --listen; these are the chart's ports)
EXPOSE 9092 9093 9094
# Kubernetes probes each role's own port over grpc.health.v1; a Docker HEALTHCHECK could
# not know which role the container runs.
HEALTHCHECK NONE
ENTRYPOINT ["highwater"]
CMD ["--help"]
