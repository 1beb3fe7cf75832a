# syntax=docker/dockerfile:1
# The Antler image: one `antler` binary with every service (`antler up`, `antler serve <service>`), on Debian
# bookworm slim with bubblewrap for the sandbox, a shell and the tools agents' commands expect, as a non-root
# user (65532). scripts/image builds the same runtime filesystem from Debian packages without a registry.
#
#   docker build -t antler .
#   docker run --rm -e ANTLER_API_KEY=change-me-0123456789 -e ANTLER_SERVICE_KEY=service-key-0123456789 \
#     -p 50051:50051 antler
#   grpcurl -plaintext -d '{"service":""}' 127.0.0.1:50051 grpc.health.v1.Health/Check
#
# The sandbox needs user namespaces inside the container: `--security-opt seccomp=unconfined
# --security-opt apparmor=unconfined --security-opt systempaths=unconfined` with Docker (helm/antler/README.md
# explains each); without them it falls back to file tools only (commands disabled), and says so in its log.

ARG DEBIAN_RELEASE=bookworm

FROM rust:1.95-slim-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p antler --bin antler \
 && install -D -m 0755 target/release/antler /out/antler

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
COPY image/packages /tmp/packages
RUN apt-get update \
 && grep -v '^#' /tmp/packages | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages
RUN groupadd --gid 65532 antler \
 && useradd --uid 65532 --gid 65532 --home-dir /var/lib/antler --no-create-home --shell /bin/bash antler \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/antler
COPY image/antler.yaml /etc/antler/antler.yaml
COPY --from=build /out/antler /usr/local/bin/antler
USER 65532:65532
WORKDIR /var/lib/antler
ENV ANTLER_CONFIG=/etc/antler/antler.yaml
EXPOSE 50051
ENTRYPOINT ["antler"]
CMD ["up"]
