# digits-pipeline.mk — the digits pipeline sample: raw MNIST pixels ->
# digits-normalize -> cnn -> digits-top1. The root Makefile includes this; it
# also works alone from the repository root:
#   make -f samples/digits-pipeline/digits-pipeline.mk digits-pipeline
#
#   digits-normalize-host  host bundle $(BUILD)/samples/digits-normalize-host/ (plover.json, normalize.so)
#   digits-top1-host       host bundle $(BUILD)/samples/digits-top1-host/ (plover.json, top1.so)
#   digits-pipeline        the pipeline manifest $(BUILD)/samples/digits-pipeline/plover.json
#                          (its middle step is the cnn sample: make cnn-host)
#   digits-pipeline-test   go test ./samples/digits-pipeline/...

BUILD ?= build
CXX ?= g++
GO ?= go
HOST_CXXFLAGS ?= -x c++ -std=c++17 -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iabi

DIGITS_DIR := samples/digits-pipeline
DIGITS_NORMALIZE_HOST := $(BUILD)/samples/digits-normalize-host
DIGITS_TOP1_HOST := $(BUILD)/samples/digits-top1-host
DIGITS_PIPELINE := $(BUILD)/samples/digits-pipeline

.PHONY: digits-normalize-host digits-top1-host digits-pipeline digits-pipeline-test

# Alone, `make -f samples/digits-pipeline/digits-pipeline.mk` builds all
# three; included, the root Makefile's default goal stands.
ifeq ($(.DEFAULT_GOAL),)
.DEFAULT_GOAL := digits-all
.PHONY: digits-all
digits-all: digits-normalize-host digits-top1-host digits-pipeline
endif

digits-normalize-host: $(DIGITS_NORMALIZE_HOST)/plover.json $(DIGITS_NORMALIZE_HOST)/normalize.so
digits-top1-host: $(DIGITS_TOP1_HOST)/plover.json $(DIGITS_TOP1_HOST)/top1.so
digits-pipeline: $(DIGITS_PIPELINE)/plover.json

$(DIGITS_NORMALIZE_HOST)/normalize.so: $(DIGITS_DIR)/normalize/normalize.cu abi/plover.h abi/plover_kernel.h
	@mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) -o $@ $<

$(DIGITS_TOP1_HOST)/top1.so: $(DIGITS_DIR)/top1/top1.cu abi/plover.h abi/plover_kernel.h
	@mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) -o $@ $<

$(DIGITS_NORMALIZE_HOST)/plover.json: $(DIGITS_DIR)/normalize/plover.json
	@mkdir -p $(@D)
	cp $< $@

$(DIGITS_TOP1_HOST)/plover.json: $(DIGITS_DIR)/top1/plover.json
	@mkdir -p $(@D)
	cp $< $@

$(DIGITS_PIPELINE)/plover.json: $(DIGITS_DIR)/plover.json
	@mkdir -p $(@D)
	cp $< $@

digits-pipeline-test:
	$(GO) test ./$(DIGITS_DIR)/...
