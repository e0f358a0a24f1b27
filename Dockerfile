# Plover server image: `plover serve`, no CUDA inside.
#
#   docker build --build-arg VERSION=$(git describe --always --dirty) -t plover .
#   docker run --rm -p 8080:8080 -v plover-data:/var/lib/plover plover --listen 0.0.0.0:8080 \
#     --data /var/lib/plover --insecure-no-auth          # a trial on a trusted machine only
#   docker run --rm --gpus all ...                      # GPU: NVIDIA container toolkit on the host
#
# GPU. The image holds no CUDA toolkit and no driver: bundles link the CUDA
# runtime statically and Plover dlopens the driver (libcuda.so.1, plus
# libnvidia-ml.so.1 for `plover devices`), which the NVIDIA container toolkit
# mounts from the node when the container asks for a GPU (`docker run --gpus`,
# or a Kubernetes `nvidia.com/gpu` limit through the NVIDIA device plugin).
# NVIDIA_DRIVER_CAPABILITIES below tells the toolkit which driver libraries to
# mount: compute (libcuda) and utility (NVML, nvidia-smi). NVIDIA_VISIBLE_DEVICES
# is deliberately not set here: `--gpus` and the device plugin set it to the GPUs
# the container was given, and an image default of "all" would hand every GPU of
# a node to a container that asked for none.
#
# Auth. Listening beyond loopback (the CMD below) needs --auth-file FILE (bearer
# tokens, `plover token new`), else plover serve refuses to start; or
# --insecure-no-auth on a trusted network only (anyone who reaches the port can
# deploy native code).
#
# Isolation. `plover serve` runs functions in worker processes (--isolation
# process, the default). As a non-root user the workers run as the same uid
# (10001); Landlock then keeps them out of the server's files, the data
# directory and each other (and the server is made non-dumpable). Landlock
# needs a Linux kernel >= 5.13 on the node and a seccomp profile that allows
# landlock_create_ruleset, landlock_add_rule and landlock_restrict_self: the
# default profiles of containerd (>= 1.6), Docker (>= 23) and CRI-O allow them,
# check yours. Without Landlock the server logs a warning once and workers are
# weaker contained: they can read what uid 10001 can and signal the server, and
# that includes the environment of tini, the ENTRYPOINT's PID 1, which holds
# the server's and is not made non-dumpable as the server is: any variable
# given to the container (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for an
# s3:// store, which are admin credentials) is readable by every function in
# /proc/1/environ. There, run only functions you trust, or give the container
# no secret in its environment.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
# golang:*-bookworm already has gcc and libc6-dev for cgo.
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath \
      -ldflags "-s -w -X github.com/plover-run/plover/cli.Version=${VERSION}" \
      -o /out/plover ./cli/plover \
 && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o /out/plover-worker ./cmd/plover-worker \
 && /out/plover version

FROM debian:bookworm-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="plover" \
      org.opencontainers.image.description="Plover: a serverless runtime for GPU kernel chains (plover serve)" \
      org.opencontainers.image.source="https://github.com/plover-run/plover" \
      org.opencontainers.image.version="${VERSION}"
# libstdc++6: C++ bundles (the host-device builds of the samples) need it at
# dlopen. ca-certificates: S3 over TLS. tini: PID 1 that forwards signals
# (SIGTERM for the drain, SIGHUP to re-read tokens and certificates) and reaps
# orphaned descendants of workers, which plover, as PID 1, would leave as zombies.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libstdc++6 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 plover \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/plover --no-create-home --shell /usr/sbin/nologin plover \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/plover
COPY --from=build /out/plover /out/plover-worker /usr/local/bin/
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/plover
VOLUME /var/lib/plover
# 8080: the API (/v1/..., /healthz, /readyz, /metrics with a read token).
# 9090: /metrics without authentication, when started with --metrics-listen 0.0.0.0:9090.
EXPOSE 8080 9090
# Health. Docker (and Compose's depends_on: service_healthy, and Swarm, which
# replaces an unhealthy task) learns that a server's devices failed only by
# asking: `plover health` asks GET /healthz on the CMD's listener over
# loopback, with no token (the probes need none), and exits 0 on 200, 1 on a
# 503 (the failed device and its error land in `docker inspect`'s health
# log), 3 when nothing answers within its --timeout. That timeout is under
# Docker's, so a hung server's probe says why instead of being killed. The
# flags are given so that a PLOVER_SERVER or PLOVER_TIMEOUT set for other
# commands (serve has a --timeout of its own) does not steer it. /healthz,
# not /readyz: a server still deploying its --repository, or draining, is
# not broken, and Swarm would replace it. The start period covers a slow
# start (the store check, CUDA contexts). Arguments that move the listener
# (another --listen port) or make it TLS (--tls-cert, or PLOVER_TLS_CERT)
# need a check of their own: `docker run --health-cmd 'plover health
# --server https://127.0.0.1:8443 --cacert /path/ca.pem'`, Compose's
# healthcheck:, or --no-healthcheck. Kubernetes ignores HEALTHCHECK (the
# chart has its own probes).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/plover", "health", "--server", "http://127.0.0.1:8080", "--timeout", "3s"]
ENTRYPOINT ["/usr/bin/tini", "--", "plover", "serve"]
CMD ["--listen", "0.0.0.0:8080", "--data", "/var/lib/plover"]
