# Plover. Quick start: `make demo`, then `make test`.
GO        ?= go
GOFMT     ?= gofmt
BUILD     := build
CXX       ?= g++
NVCC      ?= nvcc
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
HOST_CXXFLAGS := -x c++ -std=c++17 -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iabi
NVCCFLAGS := -x cu -shared -Xcompiler -fPIC -Xcompiler -Wall,-Wextra -O3 -Iabi \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
# go-nvml's cgo code calls NVML functions its own nvml.h marks deprecated:
# ~300 lines of -Wdeprecated-declarations each time it is compiled (vet, the
# test builds, -race). cgo takes no flags for one package from outside it,
# so CGO_CFLAGS turns that warning off for all, and each of Plover's cgo
# packages turns it back on in its #cgo CFLAGS (which come after these), so
# that its own C still warns. A CGO_CFLAGS of the caller's is kept as it is.
ifeq ($(origin CGO_CFLAGS),undefined)
CGO_CFLAGS := $(shell $(GO) env CGO_CFLAGS) -Wno-deprecated-declarations
endif
export CGO_CFLAGS
# What the Go binaries are built from: Go files, and what they embed
# (//go:embed in abi/abi.go, console/console.go, cli/author.go), so that a
# console or scaffold edit rebuilds bin/plover before make demo or bench.
# A new //go:embed adds its files here (TestMakefileRebuildsOnEmbeddedFiles).
GO_SRC    := $(shell find . -name '*.go' -not -path './build/*' 2>/dev/null) go.mod go.sum \
             $(wildcard device/*.c device/*.h abi/*.h) \
             $(shell find console/static cli/scaffold -type f 2>/dev/null)

.PHONY: all build samples cuda demo test vet gofmt-check fuzz fuzz-short race-short bench bench-isolation bench-batch bench-fair bench-burst bench-tenants bench-pipeline bench-transports bench-tracing bench-datapath cli-docs clean install-nvcc install-helm install-nginx install-grpcurl install-chromium proto vecadd-host vecadd-cuda gpu-artifacts gpu-check

all: build samples

build: bin/plover bin/plover-worker

bin/plover: $(GO_SRC)
	$(GO) build -ldflags "-X github.com/plover-run/plover/cli.Version=$(VERSION)" -o $@ ./cli/plover

# The worker alone, beside bin/plover: plover serve starts it per function.
bin/plover-worker: $(GO_SRC)
	$(GO) build -o $@ ./cmd/plover-worker

## Samples ------------------------------------------------------------------
VECADD_HOST := $(BUILD)/samples/vecadd-host
VECADD_CUDA := $(BUILD)/samples/vecadd-cuda
VECADD_DATA := $(BUILD)/samples/vecadd-input.bin $(BUILD)/samples/vecadd-expected.bin

samples: vecadd-host cnn-host cnn-batch-host softmax-host spin-host digits-normalize-host digits-top1-host digits-pipeline bin/cnn-classify
vecadd-host: $(VECADD_HOST)/vecadd.so $(VECADD_HOST)/b.bin $(VECADD_HOST)/plover.json $(VECADD_DATA)
vecadd-cuda: $(VECADD_CUDA)/vecadd.so $(VECADD_CUDA)/b.bin $(VECADD_CUDA)/plover.json

$(BUILD)/samples/vecadd-%/vecadd.so: samples/vecadd/vecadd.cu abi/plover.h abi/plover_kernel.h
	@mkdir -p $(@D)
	$(if $(filter cuda,$*),$(NVCC) $(NVCCFLAGS),$(CXX) $(HOST_CXXFLAGS)) -o $@ $<

$(BUILD)/samples/vecadd-%/plover.json: samples/vecadd/plover.json
	@mkdir -p $(@D)
	sed 's/"target": *"host"/"target": "$*"/' $< > $@

$(BUILD)/samples/vecadd-%/b.bin: samples/vecadd/gen/main.go
	@mkdir -p $(@D)
	$(GO) run ./samples/vecadd/gen -consts $@

$(VECADD_DATA) &: samples/vecadd/gen/main.go
	@mkdir -p $(BUILD)/samples
	$(GO) run ./samples/vecadd/gen -input $(BUILD)/samples/vecadd-input.bin -expect $(BUILD)/samples/vecadd-expected.bin

include samples/cnn/cnn.mk
include samples/softmax/softmax.mk
include samples/spin/spin.mk
include samples/digits-pipeline/digits-pipeline.mk

bin/cnn-classify: $(GO_SRC)
	$(GO) build -o $@ ./samples/cnn/cmd/cnn-classify

## CUDA (compile only here; runs need a GPU) --------------------------------
cuda: vecadd-cuda cnn-cuda cnn-batch-cuda softmax-cuda spin-cuda

install-nvcc:
	bash scripts/install-nvcc.sh

# helm (pinned, built with go install; 2.5 to 11 min once on 2 cores, idle to
# loaded, then cached) for the chart test.
install-helm:
	bash scripts/install-helm.sh

# grpcurl (pinned, built with go install; 2 to 10.5 min once on 2 cores, idle
# to loaded, then cached) for the
# gRPC tests.
install-grpcurl:
	bash scripts/install-grpcurl.sh

# Regenerates the Open Inference Protocol's gRPC code (committed) from
# grpcapi/inferencepb/grpc_predict_v2.proto: needs protoc (Debian's
# protobuf-compiler) and installs the pinned Go plugins.
PROTOC_GEN_GO := v1.36.12
PROTOC_GEN_GO_GRPC := v1.6.2
proto:
	GOBIN=$(CURDIR)/build/tools $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/build/tools $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC)
	cd grpcapi/inferencepb && PATH=$(CURDIR)/build/tools:$$PATH protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative grpc_predict_v2.proto

# Debian's nginx for the function-affinity test and scripts/nginx-example.sh.
install-nginx:
	bash scripts/install-nginx.sh

install-chromium:
	bash scripts/install-chromium.sh

# Everything scripts/gpu-check.sh needs on a GPU machine with no Go and no
# network: carry $(GPU_CARRY) there, then run `bash scripts/gpu-check.sh`,
# which unpacks the binaries and keeps within its budget (BUDGET, 540 s). They are linked without symbol tables (-s -w:
# stack traces still work) and packed into one gzip, so that what is carried
# stays under the device tool's 64 MiB with plover-worker included.
GPU_BIN   := bin/plover bin/plover-worker bin/device.test bin/plover-bench-suite
GPU_CARRY := $(BUILD)/gpu-bin.tgz $(BUILD)/samples $(BUILD)/cudatest
gpu-artifacts: samples cuda
	$(GO) build -ldflags "-s -w -X github.com/plover-run/plover/cli.Version=$(VERSION)" -o bin/plover ./cli/plover
	$(GO) build -ldflags "-s -w" -o bin/plover-worker ./cmd/plover-worker
	$(GO) build -ldflags "-s -w" -o bin/plover-bench-suite ./cmd/plover-bench-suite
	$(GO) test -c -ldflags "-s -w" -o bin/device.test ./device
	@mkdir -p $(BUILD)/cudatest
	$(NVCC) $(NVCCFLAGS) -o $(BUILD)/cudatest/testkernels.so device/testdata/kernels.cu
	tar czf $(BUILD)/gpu-bin.tgz $(GPU_BIN)
	@du -cm $(GPU_CARRY) | tail -1 | awk '{ print "gpu-artifacts: carry " $$1 " MiB: $(GPU_CARRY)"; if ($$1 > 63) { print "over the 64 MiB the device tool carries"; exit 1 } }'

gpu-check:
	bash scripts/gpu-check.sh

## Everyday ------------------------------------------------------------------
demo: bin/plover bin/plover-worker samples
	bash scripts/demo.sh

# gofmt -l names the files it would change and exits 0; a file it cannot
# parse it reports on stderr with status 2. Either fails here. (Piped into
# grep, only grep's status counted: a parse error passed, and go vet skips a
# file its build tags leave out, e.g. //go:build !unix.)
gofmt-check:
	@out=$$($(GOFMT) -l . 2>&1); status=$$?; \
	if [ $$status -ne 0 ] || [ -n "$$out" ]; then \
	  printf '%s\n' "$$out"; echo "gofmt: the files above need gofmt, or it failed (status $$status)"; exit 1; \
	fi

vet: gofmt-check
	$(GO) vet ./...
	$(GO) mod tidy -diff || (echo "go.mod/go.sum are not tidy: run go mod tidy" && false)
	cd deploy/helm/charttest && $(GO) vet ./... && ($(GO) mod tidy -diff || (echo "deploy/helm/charttest: run go mod tidy there" && false))
	cd deploy/kserve/manifesttest && $(GO) vet ./... && ($(GO) mod tidy -diff || (echo "deploy/kserve/manifesttest: run go mod tidy there" && false))

# The first run builds a pinned MinIO for the S3 tests (5 min or more, once), up
# front and saying so. bin/testreport prints each package as it ends, every
# test still running after 20 s, and at the end the tests skipped and why
# (helm, nginx, MinIO missing: .ci/run installs them all).
test: vet fuzz-short race-short bin/plover bin/plover-worker bin/testreport samples
	@echo "MinIO for the S3 tests: built once into ~/.cache/plover (5 minutes or more the first time)"
	-@$(GO) run ./internal/minio/cmd/install-minio >/dev/null
	bash -o pipefail -c '$(GO) test -count=1 -timeout 30m -json ./... | bin/testreport'
	bash -o pipefail -c 'cd deploy/helm/charttest && $(GO) test -count=1 -json ./... | ../../../bin/testreport'
	bash -o pipefail -c 'cd deploy/kserve/manifesttest && $(GO) test -count=1 -json ./... | ../../../bin/testreport'

# The tests of shared state under concurrent requests, with the race
# detector: the gate's buckets, request metrics, labels kept from borrowed
# request bytes under keep-alive traffic, gRPC calls holding their token's
# place, batched runs following one another on an instance, the drain's
# refusals; and whole the packages whose tests take seconds under it. The
# whole suite under -race takes too long for every run (engine, httpapi,
# grpcapi and worker 3-6 minutes each on 2 cores).
race-short:
	$(GO) test -race -count=1 ./gate ./reqmetrics ./ioshare ./bundle ./netguard ./funclog ./frontdoor ./loader ./auth
	$(GO) test -race -count=1 -run 'Labels|Stalled|BoundsItsBody|CallWithoutItsMessage|SequentialCalls' ./httpapi ./grpcapi
	$(GO) test -race -count=1 -run 'TestBatchRunsReadTheirOwnTiming|Refuse' ./engine
	$(GO) test -race -count=1 -run 'GracesEnd|Refuse' ./pipeline

# Fuzzing: each target's seeds, then new inputs for a while, one go test per
# target (it fuzzes one at a time). An input that fails is written under the
# package's testdata/fuzz: a bug; go test -run=FuzzX/ID reruns it. A new
# input is minimized for 1 s, not the default minute, which would take a
# short run's whole time. fuzz-short is part of test; fuzz goes on longer.
FUZZTIME ?= 5m
fuzz1 = $(GO) test -run '^$$' -fuzz '^$(2)$$' -fuzztime $(3) -fuzzminimizetime 1s ./$(1)

# fuzz-short counts executions (5 to 25 s each on 2 busy cores, up to 2 min
# on a heavily loaded machine) rather than
# time: a time budget that ends while the baseline is still gathered (a
# loaded machine) fails with "context deadline exceeded".
fuzz-short:
	$(call fuzz1,httpapi,FuzzInferHeader,20000x)
	$(call fuzz1,httpapi,FuzzV2InferBody,20000x)
	$(call fuzz1,abi,FuzzParseManifest,200000x)
	$(call fuzz1,bundle,FuzzUnpack,2000x)

fuzz:
	$(call fuzz1,httpapi,FuzzInferHeader,$(FUZZTIME))
	$(call fuzz1,httpapi,FuzzV2InferBody,$(FUZZTIME))
	$(call fuzz1,abi,FuzzParseManifest,$(FUZZTIME))
	$(call fuzz1,bundle,FuzzUnpack,$(FUZZTIME))

bin/testreport: internal/testreport/main.go
	$(GO) build -o $@ ./internal/testreport

bin/plover-bench-suite: $(GO_SRC)
	$(GO) build -o $@ ./cmd/plover-bench-suite

# vecadd and the CNN against real plover serve processes and in-process, latency against
# offered load, hot-path Go benchmarks; rewrites BENCHMARKS.md's bench:host section and
# docs/cnn-latency.svg (about 1.5 min on 2 cores). GPU machine: bin/plover-bench-suite --device cuda
bench: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host
	bash scripts/isolation-bench.sh host

# The CNN with and without batching, same server, same run; rewrites BENCHMARKS.md's
# bench:batch-host section and docs/cnn-batch-host.svg (about 1.5 min).
bench-batch: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --batch

# Sharing a device: the CNN beside floods, shares, priorities, --sched fair
# against off in one run; rewrites BENCHMARKS.md's bench:fair-host section (about 3 min).
bench-fair: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --fair

# Many functions: cold starts of distinct functions in turn and at once, the
# listing and /metrics with 1,000 deployed, idle workers' memory; rewrites
# BENCHMARKS.md's bench:burst-host section (about 1 min).
bench-pipeline: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --pipeline $(if $(BEFORE),--pipeline-before $(BEFORE))

# The CNN hot over HTTP and gRPC on one server (make bench-transports;
# rewrites BENCHMARKS.md's bench:transports-host section, about a minute).
bench-transports: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --transports

# The data path: vecadd 4 MB in and out against an echo floor that reads,
# spins for the kernel's time and answers the same bytes; BEFORE=an earlier
# plover binary adds it to the same run (rewrites BENCHMARKS.md's
# bench:datapath-host section, about a minute).
bench-datapath: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --datapath $(if $(BEFORE),--datapath-before "$(BEFORE)")

# What tracing costs: the CNN hot with tracing off, on unsampled and on
# sampled, side by side (rewrites BENCHMARKS.md's bench:tracing-host section).
bench-tracing: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --tracing $(if $(BEFORE),--tracing-before $(BEFORE))

bench-burst: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --burst

# Tenant workers (issue 46): 120 functions of 2 tenants with --worker-scope
# function and tenant in turn, then 1,000 functions of 10 tenants; rewrites
# BENCHMARKS.md's bench:tenants-host section (about 5 min; PSS needs root).
bench-tenants: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bin/plover-bench-suite --plover bin/plover --device host --tenants

# The cost of isolation: the CNN through --isolation none and process, same run,
# then the many-functions figures of bench-burst (about 2 min).
bench-isolation: bin/plover bin/plover-worker bin/plover-bench-suite samples
	bash scripts/isolation-bench.sh host
	bin/plover-bench-suite --plover bin/plover --device host --burst

# docs/cli: the CLI reference, generated from the commands (make test fails when it is stale).
cli-docs:
	PLOVER_UPDATE_CLI_DOCS=1 $(GO) test -count=1 -run TestCLIReferenceUpToDate ./cli

clean:
	rm -rf bin $(BUILD)
