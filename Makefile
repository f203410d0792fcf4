# The front door. `make demo` runs the main job; `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo
ENV_FILE ?= .e2e/env

.PHONY: build demo test test-matrix bench bench-quick bench-quick-servers bench-quick-node lint crds check-crds manifests chart-readme docs release-binaries release check-images obtain prerequisites services-up services-down clean

## Check, and install when missing (Debian packages as root, the musl target), what the
## targets below need; silent and well under a second when everything is present.
prerequisites:
	e2e/bin/prerequisites

build:
	$(CARGO) build --workspace --all-targets

## Build (once, then cached outside the repository) every third-party server the tests use.
obtain: prerequisites
	e2e/bin/obtain all

## The main job: the operator and a workspace task publishing to lakeFS, on the real servers.
demo: obtain release-binaries
	$(CARGO) build -q -p perago-sidecar -p perago-operator --bins
	$(CARGO) run -q -p perago-e2e --bin perago-demo

## Every test: unit, CLI, the differential test against Python Perago, and the real servers
## and node (whose images are made from the release binaries), in two lanes at once
## (e2e/bin/test; docs/testing.md). Each test binary obtains the third-party servers it needs.
test: prerequisites release-binaries
	CARGO=$(CARGO) e2e/bin/test

## The Kubernetes version matrix (docs/versioning.md): the checks of what the project relies on
## in a cluster, on the chart's floor and the newest release served, or on
## PERAGO_MATRIX_VERSIONS. Too long for every CI run: about 10 minutes a version once built.
test-matrix: prerequisites
	e2e/bin/test-matrix

## Benchmarks against the real servers; they print figures and ratios.
bench: obtain release-binaries
	$(CARGO) bench -p perago-sidecar --bench runtime --bench workspace --bench data_path
	$(CARGO) bench -p perago-e2e --bench scaling --bench operator --bench fleet

## Every benchmark at smoke size, in the test build (CI runs it): each path they measure runs
## once against the real servers; the figures mean nothing. `--workspace` resolves features
## as `make test` does, so only the benchmarks themselves compile after it. The servers' half
## needs no node, so CI runs it beside the node's tests (.ci/run).
bench-quick: bench-quick-servers bench-quick-node

bench-quick-servers: obtain release-binaries
	PERAGO_BENCH_TASKS=20 PERAGO_BENCH_RUNS=1 PERAGO_BENCH_TRIES=1 PERAGO_BENCH_SCALE=5 PERAGO_BENCH_PODS=1 $(CARGO) bench --profile dev --workspace --bench runtime --bench workspace --bench data_path

bench-quick-node: obtain release-binaries
	PERAGO_BENCH_RUNS=1 PERAGO_BENCH_TASKS=10 PERAGO_BENCH_STEADY_SECONDS=5 \
	  PERAGO_BENCH_FLEET_TASKS=12 PERAGO_BENCH_FLEET_NODES=3 PERAGO_BENCH_FLEET_REPLICAS=2 PERAGO_BENCH_FLEET_RESYNC_SECONDS=10 \
	  $(CARGO) bench --profile dev --workspace --bench node

## Fuzz every cargo-fuzz target for FUZZ_SECONDS (default 1800) each, one after another, and
## print executions and crashes per target (nightly, cargo-fuzz; see docs/fuzzing.md).
.PHONY: fuzz
FUZZ_SECONDS ?= 1800
fuzz:
	e2e/bin/prerequisites fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run

## Regenerate the PeragoTask reference from the CRD (a test fails when it drifts).
docs:
	$(CARGO) run -q -p perago-operator -- reference > docs/reference/peragotask.md

## Static (musl) release binaries into $(OUT), exactly as the Dockerfile's build stage makes them,
## and the kubectl plugin (kubectl-perago), released beside them.
RELEASE_TARGET := x86_64-unknown-linux-musl
OUT ?= target/release-binaries
release-binaries: prerequisites
	PERAGO_REVISION=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) \
	  $(CARGO) build --release --locked --target $(RELEASE_TARGET) -p perago-operator -p perago-sidecar -p perago-runner -p perago-kubectl --bins
	mkdir -p $(OUT)
	@# Copied beside and renamed into place: a test may be running one of them (CI builds
	@# this again beside the node's tests), and a busy executable cannot be written.
	for bin in perago-operator perago-sidecar perago-runner kubectl-perago; do \
	  cp target/$(RELEASE_TARGET)/release/$$bin $(OUT)/.$$bin.new && mv -f $(OUT)/.$$bin.new $(OUT)/$$bin || exit 1; \
	done

## A release: multi-architecture images (image indexes), the chart as an OCI artifact with its
## images pinned by digest, a CycloneDX SBOM per image, kubectl-perago archives and their krew
## manifest, pushed to REGISTRY and signed with cosign (docs/release.md). VERSION=x.y.z
## REGISTRY=host[:port]/path COSIGN_KEY=cosign.key (or UNSIGNED=1); ARCHS (default
## "amd64 arm64"), PLAIN_HTTP=1, KREW_BASE_URL are optional.
release:
	VERSION="$(VERSION)" REGISTRY="$(REGISTRY)" e2e/bin/release

## Lint the Dockerfile and check the binaries it ships (static, run as the image's user).
check-images: prerequisites
	e2e/bin/obtain hadolint >/dev/null
	$$(e2e/bin/obtain hadolint | cut -d' ' -f2) Dockerfile
	$(MAKE) release-binaries
	e2e/bin/check-release-binaries $(OUT)

lint: prerequisites
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@# Licenses, sources and duplicate crates of the dependency graph (deny.toml).
	$$(e2e/bin/obtain cargo-deny | cut -d' ' -f2) check --hide-inclusion-graph licenses bans sources
	@test -z "$$(gofmt -l e2e/kstatus e2e/cert-manager e2e/argocd-lua e2e/gitserver)" || { gofmt -l e2e/kstatus e2e/cert-manager e2e/argocd-lua e2e/gitserver; echo "gofmt: the files above need formatting"; exit 1; }
	shellcheck -x -S warning e2e/bin/obtain e2e/bin/node-janitor e2e/bin/images e2e/bin/janitor e2e/bin/watchdog e2e/bin/check-release-binaries e2e/bin/prerequisites e2e/bin/build-cache e2e/bin/test e2e/bin/test-matrix e2e/bin/release fuzz/run deploy/krew/manifest .ci/run

## Regenerate the committed CRD (CI fails when it drifts).
crds:
	$(CARGO) run -q -p perago-operator -- crd > crds/peragotasks.perago.io.yaml
	cp crds/peragotasks.perago.io.yaml charts/perago-operator/crds/

## Regenerate the chart's README from its values and schema (a test fails when it drifts).
chart-readme:
	PERAGO_WRITE_CHART_README=1 $(CARGO) test -q -p perago-e2e --test chart the_chart_readme_lists_every_value

## Regenerate the kustomize base from the chart (a test fails when it drifts).
manifests: crds
	e2e/bin/obtain helm >/dev/null
	deploy/kustomize/generate $$(e2e/bin/obtain helm | cut -d' ' -f2) > deploy/kustomize/base/perago-operator.yaml

check-crds:
	diff -u crds/peragotasks.perago.io.yaml <($(CARGO) run -q -p perago-operator -- crd)
	diff -u crds/peragotasks.perago.io.yaml charts/perago-operator/crds/peragotasks.perago.io.yaml

## Start the real servers in the background; their environment goes to $(ENV_FILE).
services-up: obtain release-binaries
	@mkdir -p $(dir $(ENV_FILE))
	$(CARGO) build -q -p perago-e2e --bin perago-e2e
	@rm -f $(ENV_FILE)
	@nohup target/debug/perago-e2e up --env-file $(ENV_FILE) > $(dir $(ENV_FILE))services.log 2>&1 & echo $$! > $(dir $(ENV_FILE))services.pid
	@for i in $$(seq 1 300); do [ -s $(ENV_FILE) ] && break; kill -0 $$(cat $(dir $(ENV_FILE))services.pid) 2>/dev/null || { cat $(dir $(ENV_FILE))services.log; exit 1; }; sleep 1; done
	@cat $(ENV_FILE)
	@echo "# source $(ENV_FILE) to use them; make services-down stops them"

services-down:
	@if [ -f $(dir $(ENV_FILE))services.pid ]; then kill $$(cat $(dir $(ENV_FILE))services.pid) 2>/dev/null || true; rm -f $(dir $(ENV_FILE))services.pid; fi
	@echo "servers stopped"
