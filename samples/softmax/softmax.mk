# softmax.mk — the dense layer + softmax sample. The root Makefile includes
# this; it also works alone from the repository root:
#   make -f samples/softmax/softmax.mk softmax-host
#
#   softmax-host   host bundle  $(BUILD)/samples/softmax-host/ (plover.json, softmax.so, weights.bin),
#                  plus a request and its expected response in $(BUILD)/samples/
#   softmax-cuda   CUDA bundle  $(BUILD)/samples/softmax-cuda/ (nvcc; nothing runs it here)
#   softmax-test   go test ./samples/softmax/...
#   softmax-bench  the chain on the host device

BUILD ?= build
CXX ?= g++
NVCC ?= nvcc
GO ?= go
HOST_CXXFLAGS ?= -x c++ -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra -Iabi
NVCCFLAGS ?= -x cu -shared -Xcompiler -fPIC -O3 -Iabi -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]

SOFTMAX_DIR := samples/softmax
SOFTMAX_HOST := $(BUILD)/samples/softmax-host
SOFTMAX_CUDA := $(BUILD)/samples/softmax-cuda
SOFTMAX_DATA := $(BUILD)/samples/softmax-input.bin $(BUILD)/samples/softmax-expected.bin
SOFTMAX_GEN := $(SOFTMAX_DIR)/gen/main.go $(SOFTMAX_DIR)/model/model.go

.PHONY: softmax-host softmax-cuda softmax-test softmax-bench

# Alone, `make -f samples/softmax/softmax.mk` builds the host bundle;
# included, the root Makefile's default goal stands.
ifeq ($(.DEFAULT_GOAL),)
.DEFAULT_GOAL := softmax-host
endif

softmax-host: $(SOFTMAX_HOST)/softmax.so $(SOFTMAX_HOST)/weights.bin $(SOFTMAX_HOST)/plover.json $(SOFTMAX_DATA)
softmax-cuda: $(SOFTMAX_CUDA)/softmax.so $(SOFTMAX_CUDA)/weights.bin $(SOFTMAX_CUDA)/plover.json

$(BUILD)/samples/softmax-%/softmax.so: $(SOFTMAX_DIR)/softmax.cu abi/plover.h abi/plover_kernel.h
	@mkdir -p $(@D)
	$(if $(filter cuda,$*),$(NVCC) $(NVCCFLAGS),$(CXX) $(HOST_CXXFLAGS)) -o $@ $<

# The CUDA manifest is the host one with another target; bundle_test.go
# checks plover.json holds exactly one "target": "host" for this sed.
$(BUILD)/samples/softmax-%/plover.json: $(SOFTMAX_DIR)/plover.json
	@mkdir -p $(@D)
	sed 's/"target": *"host"/"target": "$*"/' $< > $@

$(BUILD)/samples/softmax-%/weights.bin: $(SOFTMAX_GEN)
	@mkdir -p $(@D)
	$(GO) run ./$(SOFTMAX_DIR)/gen -weights $@

$(SOFTMAX_DATA) &: $(SOFTMAX_GEN)
	@mkdir -p $(BUILD)/samples
	$(GO) run ./$(SOFTMAX_DIR)/gen -input $(BUILD)/samples/softmax-input.bin -expect $(BUILD)/samples/softmax-expected.bin

softmax-test:
	$(GO) test ./$(SOFTMAX_DIR)/...

softmax-bench:
	$(GO) test -run '^$$' -bench Chain -count 5 ./$(SOFTMAX_DIR)
