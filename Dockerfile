# syntax=docker/dockerfile:1
# GCR image: gcr-agent, gcrctl and the shim, built from source on Debian bookworm.
# The shim (libgcr.so), its libjansson.so.4 and gcr-hold (a static preStop hook) sit in /opt/gcr/lib, which
# the Helm chart's init container copies to the node for the device plugin.
#
#   docker build -t gcr:dev .
#   docker build --build-arg CHECK=1 -t gcr:dev .   # also run make check
#
# tests/k8s/test_chart.sh lints this file (COPY sources exist, the build runs what
# CI runs) and runs scripts/image-stage.sh on CI's build tree.

ARG DEBIAN_IMAGE=debian:bookworm

FROM ${DEBIAN_IMAGE} AS build
ARG CHECK=0
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# CI's package list (scripts/install-deps.sh: protobuf-c-compiler among them, for the C code the
# build makes from node-agent/'s .proto files), plus pip for its CUDA 13.0 headers
# (headers only: libcuda is opened at run time, never linked or shipped).
RUN apt-get update -qq && \
    apt-get install -y -qq --no-install-recommends ca-certificates python3-pip && \
    rm -rf /var/lib/apt/lists/*
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/* .cache/cuda/wheel
COPY . .
# As tests/run.sh builds (autogen, configure in build/, make); CHECK=1 also tests.
RUN ./autogen.sh && \
    mkdir -p build && cd build && \
    ../configure -q --prefix=/usr/local && \
    make -j"$(nproc)" && \
    if [ "$CHECK" = 1 ]; then make -j"$(nproc)" check; fi
# CRIU >= 4 for images of pods (docs/images.md, "Pods"; chart value images.pods): Debian
# trixie's criu 4.1.1 built from its source package (bookworm's 3.17 fails on 6.x kernels),
# shipped as /usr/local/sbin/criu with the packages of its libraries.
RUN criu=$(scripts/install-criu.sh) && GCR_STAGE_CRIU=$criu scripts/image-stage.sh build /stage

FROM ${DEBIAN_IMAGE}-slim
LABEL org.opencontainers.image.title="gcr" \
      org.opencontainers.image.description="GCR: fast checkpoint/restore of GPU processes (gcr-agent, gcrctl, shim)"
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Exactly the packages owning the libraries the shipped binaries load.
COPY --from=build /stage/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -qq && \
    xargs -a /tmp/runtime-packages.txt apt-get install -y -qq --no-install-recommends ca-certificates && \
    rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
COPY --from=build /stage/usr/local/bin/ /usr/local/bin/
COPY --from=build /stage/usr/local/sbin/ /usr/local/sbin/
COPY --from=build /stage/opt/gcr/lib/ /opt/gcr/lib/
# Fail the build, not the node, if a library is missing.
RUN for f in /usr/local/bin/* /usr/local/sbin/criu /opt/gcr/lib/libgcr.so; do \
        if ldd "$f" | grep 'not found'; then echo "$f: missing libraries" >&2; exit 1; fi; \
    done && \
    test -x /usr/local/bin/gcr-agent && test -x /usr/local/bin/gcrctl && \
    /usr/local/sbin/criu --version | grep -q '^Version: 4' && \
    test -f /opt/gcr/lib/libgcr.so && test -f /opt/gcr/lib/libjansson.so.4 && test -x /opt/gcr/lib/gcr-hold
ENTRYPOINT ["/usr/local/bin/gcr-agent"]
