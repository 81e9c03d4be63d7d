# edgeprobe: `make demo` runs the main job end to end, `make test` runs every test.
GO      ?= go
CC      ?= gcc
GOFLAGS ?=
RUNTIME_CFLAGS = -O2 -g -fPIC -shared -fno-plt -pthread -ftls-model=initial-exec \
                 -fvisibility=hidden -Wall -Wextra -Werror
RUNTIME_SRC    = $(wildcard runtime/*.c runtime/*.h runtime/*.S)

.PHONY: all build test test-long test-short vet fuzz demo bench bench-quick gobench killtable clean FORCE

all: build

build: bin/coldpatch bin/hotpatch bin/libedgeprobe.so bin/libedgeprobe.a

# Go's own cache decides what to rebuild; FORCE makes make always ask it.
# CGO_ENABLED=0: nothing here calls C, and cobra's net import would link
# libc and ld.so into every start of the commands (D67).
bin/coldpatch bin/hotpatch: FORCE
	CGO_ENABLED=0 $(GO) build $(GOFLAGS) -o $@ ./cmd/$(notdir $@)

bin/libedgeprobe.so: $(RUNTIME_SRC)
	@mkdir -p bin
	$(CC) $(RUNTIME_CFLAGS) $(filter %.c %.S,$^) -o $@

# Every .c and .S file under runtime/ is the runtime (internal/testutil and
# internal/bench list them the same way). Objects are named after the whole
# file name: edgeprobe_fentry.c and edgeprobe_fentry.S both exist.
# The runtime for static programs: link it whole (-Wl,--whole-archive), so its
# hooks, not glibc's (one aliased no-op for enter and exit), are the ones called.
# EP_ARCHIVE: its swapcontext calls libc.a's under its internal name (no dlsym there).
bin/libedgeprobe.a: $(RUNTIME_SRC)
	@mkdir -p bin/obj
	rm -f bin/obj/*.o
	$(foreach f,$(filter %.c %.S,$^),$(CC) $(filter-out -shared,$(RUNTIME_CFLAGS)) -DEP_ARCHIVE -c $(f) -o bin/obj/$(notdir $(f)).o &&) true
	rm -f $@ && ar rcs $@ $(patsubst runtime/%,bin/obj/%.o,$(filter %.c %.S,$^))

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }

# Every test but the opt-in ones, within 10 minutes on two cores (docs/testing.md).
# The ptrace and /proc/PID/mem tests skip with a reason unless run as root; with CI=true
# a test that cannot run fails instead. The log shows each package's result, failed
# tests' output, skipped tests' reasons, the slowest packages and tests, and ends with
# "N passed, N failed, N skipped"; out/test/ keeps the JSON events and that line.
# -timeout is go test's default, per package: what passes here passes `go test ./...`.
TESTSUMMARY = $(GO) run ./internal/testjson/cmd/testsummary -json out/test/go-test.json -line out/test/summary.txt
test: build vet
	@rm -f out/test/summary.txt
	$(TESTSUMMARY) -- $(GOFLAGS) -count=1 -timeout 10m ./...

# The long matrices (every -O level) and the soaks, EDGEPROBE_SOAK per stress test.
EDGEPROBE_SOAK ?= 30s
test-long: build vet
	EDGEPROBE_LONG=1 EDGEPROBE_SOAK=$(EDGEPROBE_SOAK) $(TESTSUMMARY) -budget 60m -- $(GOFLAGS) -count=1 -timeout 60m ./...

# docs/protocols.md's "SIGKILL and repair" table, from two runs of the SIGKILL soak
# (TestKillNine, 100 kills per row; about 10 minutes a run on two cores).
killtable: build
	nice -n 19 $(GO) run ./internal/hotpatch/cmd/killtable -runs 2 -doc docs/protocols.md

test-short: build
	$(GO) test $(GOFLAGS) -short ./...

# Each fuzz target for a while (the seed corpora also run in `make test`). Minimisation
# is capped: uncapped, each new input may be minimised for a minute while the exec
# counter stands still, which looks like a hang and is not one.
FUZZTIME ?= 30s
FUZZ = $(GO) test -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s -fuzz
fuzz:
	$(FUZZ) '^FuzzRead$$' ./internal/probelist
	$(FUZZ) '^FuzzCompact$$' ./internal/probelist
	$(FUZZ) '^FuzzScan$$' ./internal/elfscan
	$(FUZZ) '^FuzzEhFrame$$' ./internal/elfscan
	$(FUZZ) '^FuzzMcountLoc$$' ./internal/elfscan
	$(FUZZ) '^FuzzDecode$$' ./internal/x86dec
	$(FUZZ) '^FuzzParseHeader$$' ./internal/shm
	$(FUZZ) '^FuzzParse$$' ./internal/calibrate
	$(FUZZ) '^FuzzSignatures$$' ./internal/dwarfargs
	$(FUZZ) '^FuzzReader$$' ./internal/perfetto
	$(FUZZ) '^FuzzParseObject$$' ./internal/inject
	$(FUZZ) '^FuzzSessionLine$$' ./internal/cli
	$(FUZZ) '^FuzzSessionResultJSON$$' ./internal/cli
	$(FUZZ) '^FuzzReadLines$$' ./internal/cli
	$(FUZZ) '^FuzzRecords$$' ./internal/capture
	$(FUZZ) '^FuzzBuildID$$' ./internal/elfnote
	$(FUZZ) '^FuzzParseExec$$' ./internal/procmaps
	$(FUZZ) '^FuzzProgHeaders$$' ./internal/procmaps
	$(FUZZ) '^FuzzObjectFacts$$' ./internal/inject
	$(FUZZ) '^FuzzReplay$$' ./internal/report
	$(FUZZ) '^FuzzPrintable$$' ./internal/calltrace
	$(FUZZ) '^FuzzParseStat$$' ./internal/procfs
	$(FUZZ) '^FuzzParseSelector$$' ./internal/probelist
	$(FUZZ) '^FuzzParse$$' ./internal/phases
	$(FUZZ) '^FuzzInflightSites$$' ./internal/shm

demo: build
	./scripts/demo.sh

# The report of BENCHMARKS.md (out/bench/results.{json,md}); -setup installs missing peers
# (bpftrace, linux-perf, the XRay runtime) from Debian's packages. Go's own micro-benchmarks
# (scanner, coldpatch, protocols, runtime hook cost): make gobench.
bench: build
	$(GO) run ./internal/bench/cmd/benchreport -setup

bench-quick: build
	$(GO) run ./internal/bench/cmd/benchreport -quick

gobench: build
	$(GO) test -run '^$$' -bench . -benchtime 3x ./internal/elfscan ./internal/coldpatch ./internal/xmod ./internal/shm

clean:
	rm -rf bin out
