# spin.mk — the compute-bound neighbour of the device-sharing benchmark
# (make bench-fair). The root Makefile includes this.
#
#   spin-host   host bundle $(BUILD)/samples/spin-host/ (plover.json, spin.so)
#   spin-cuda   CUDA bundle $(BUILD)/samples/spin-cuda/ (nvcc; nothing runs it here)

SPIN_DIR := samples/spin

.PHONY: spin-host spin-cuda

spin-host: $(BUILD)/samples/spin-host/spin.so $(BUILD)/samples/spin-host/plover.json
spin-cuda: $(BUILD)/samples/spin-cuda/spin.so $(BUILD)/samples/spin-cuda/plover.json

$(BUILD)/samples/spin-%/spin.so: $(SPIN_DIR)/spin.cu abi/plover.h abi/plover_kernel.h
	@mkdir -p $(@D)
	$(if $(filter cuda,$*),$(NVCC) $(NVCCFLAGS),$(CXX) $(HOST_CXXFLAGS)) -o $@ $<

$(BUILD)/samples/spin-%/plover.json: $(SPIN_DIR)/plover.json
	@mkdir -p $(@D)
	sed 's/"target": *"host"/"target": "$*"/' $< > $@
