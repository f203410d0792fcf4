# syntax=docker/dockerfile:1
# The two images of Perago for Kubernetes, built from one stage of static (musl) binaries:
#
#   docker build --target operator -t ghcr.io/perago/perago-operator:0.1.0 .
#   docker build --target sidecar  -t ghcr.io/perago/perago-sidecar:0.1.0 .
#
# The sidecar image also carries perago-runner, which the sidecar container's postStart hook
# copies into the pod's shared volume; being static, the runner runs in any body image.
# CI builds the binaries with the same `make release-binaries` and lints this file.

# The channel of rust-toolchain.toml (a test in e2e/tests/docs_facts.rs keeps them equal).
ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# musl-gcc compiles ring's C and assembly for the static target.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the crates.io downloads and the target directory between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    make release-binaries OUT=/out

# distroless "static": no shell, no package manager, CA certificates and tzdata only.
FROM gcr.io/distroless/static-debian12:nonroot AS operator
COPY --from=build /out/perago-operator /usr/local/bin/perago-operator
# kubectl-perago too, for the chart's optional staging-branch CronJob (stagingGc).
COPY --from=build /out/kubectl-perago /usr/local/bin/kubectl-perago
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/perago-operator"]
CMD ["run"]

FROM gcr.io/distroless/static-debian12:nonroot AS sidecar
COPY --from=build /out/perago-sidecar /out/perago-runner /usr/local/bin/
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/perago-sidecar"]
