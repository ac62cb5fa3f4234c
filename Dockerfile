# The dlrover-events image: every service and command of one install, one entrypoint.
#
#   docker build -t REGISTRY/dlrover-events:0.1.0 .
#
# The install itself is deploy/image/install.sh (the runtime dependencies only: no dev,
# torch, embedded or sim extras), which the suite runs into a fresh venv
# (tests/integration/deploy/test_image_install.py). Training images do not use this
# image: they add the light SDK (`pip install ./sdk`, see deploy/README.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
COPY . /src
RUN sh /src/deploy/image/install.sh /src /opt/dlrover-events

FROM ${PYTHON_IMAGE}
# The uid/gid the manifests run as (runAsUser/runAsGroup 10001, runAsNonRoot).
RUN groupadd --system --gid 10001 dlrover \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/dlrover-events --shell /usr/sbin/nologin dlrover \
 && mkdir -p /var/lib/dlrover-events \
 && chown 10001:10001 /var/lib/dlrover-events
COPY --from=build /opt/dlrover-events /opt/dlrover-events
ENV PATH=/opt/dlrover-events/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/dlrover-events \
    DLROVER_EVENTS_DATA_DIR=/var/lib/dlrover-events
USER 10001:10001
WORKDIR /var/lib/dlrover-events
ENTRYPOINT ["dlrover-events"]
CMD ["--help"]
