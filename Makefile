# polevault build.
#
#   make                  build what the README's first command runs: train and demo (BACKEND: auto)
#   make tests            build the test binaries; make benches: the benchmarks; make everything: all three
#   make test             build and run the test suite on this backend
#   make test-asan        the suite on the host backend under AddressSanitizer + UBSan
#   make test-tsan        the kernel suites under ThreadSanitizer (shared-memory race checker)
#   make test-full        the suite under every schedule and rank count, plus the larger cases
#                         kept out of `make test` ([full]); docs/testing.md's "Which schedules each
#                         suite meets" lists what only it runs (FULL=1 does the same for
#                         test-asan and test-tsan)
#   make test-interop     the host `train` against transformers, tokenizers and safetensors from
#                         PyPI (test/interop/, a pinned virtual environment in build/interop-venv)
#   make fuzz             a libFuzzer target per file reader, each run FUZZ_SECONDS (default 10)
#   make fuzz-long        the same targets to 10^6 executions each (whoever touches a reader runs it)
#   make bench            build and run the benchmarks
#   make ptxas-report     registers, shared memory and spills of every kernel for sm_90 (and of
#                         the attention kernels for sm_80), and the attention kernels' tile loops
#                         by instruction class, for both
#   make attention-sass   rewrite model/attention_sass.h (the performance model's attention
#                         instruction counts) from the kernels' SASS; make sass-check compares
#   make format           clang-format (.clang-format) over every C++/CUDA source
#   make clean
#
# BACKEND=auto|cuda|host. auto picks cuda when `nvidia-smi -L` lists a GPU, else host.
# - cuda: every .cu file through nvcc (sm_80 + sm_90, C++20), linked with cudart and cuBLAS.
# - host: every .cu file through g++ as C++, linked with host/ (the CUDA runtime, launch and
#   cuBLAS subsets on the CPU) and OpenBLAS.
# Warnings are errors in both. Objects go to build/<flavour>/, so flavours never mix.
#
# Every compile goes through ccache when it is installed (install-deps.sh installs it): see
# "Compiler cache" below. CCACHE= (empty) turns it off.

# Every core by default (a plain `make` on a 2-core machine builds twice as fast); -jN overrides.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
  MAKEFLAGS += -j$(shell nproc)
endif

BACKEND ?= auto
ifeq ($(BACKEND),auto)
  BACKEND := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo cuda || echo host)
endif
ifneq ($(filter-out cuda host,$(BACKEND)),)
  $(error BACKEND must be auto, cuda or host (got '$(BACKEND)'))
endif

CUDA_HOME ?= /usr/local/cuda
CXX := g++

# Compiler cache. ccache keys an object by the preprocessed source and the command line, so the
# same commit built in another clone (CI's fresh clone, right after the work was built in the
# working checkout) takes its objects from the cache instead of compiling them. What makes a
# clone in another folder hit: every path on our command lines is relative, except the two below;
# base_dir makes ccache rewrite absolute paths under the checkout to relative ones before hashing;
# -fdebug-prefix-map writes the checkout as "." into g++'s and clang's debug info (so the cached
# object names no folder). nvcc's -lineinfo counts as debug info to ccache, but nvcc has no prefix
# map: for nvcc the working directory is left out of the key (hash_dir off), and an nvcc object
# from the cache names, in its line tables, the folder of the checkout that compiled it first.
# The cache is ccache's own (~/.cache/ccache unless configured), with its own size limit (5 GB by
# default); all five flavours CI builds took 138 MB of it, compressed (docs/testing.md, "CI").
#
# Depend mode: on a miss ccache hashes the dependency file the compiler writes anyway (DEPFLAGS)
# instead of running the preprocessor once more first, which cost the cold CUDA build 61 s (609 s
# against 548 s uncached; a miss of test_rope.cu under nvcc took 8.5 and 9.5 s, and 7.8 and 8.7 s
# in depend mode, on this 2-core VM). A hit is found as in
# direct mode, from the manifest of every file the object was built from, so the dependency files
# name system headers too (-MD, not -MMD): an upgraded Debian or CUDA header changes the key.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
  export CCACHE_BASEDIR := $(CURDIR)
  export CCACHE_DEPEND := 1
endif
# Every compile writes its dependency file beside its object (make includes them at the end).
DEPFLAGS := -MD -MP
CXXC := $(CCACHE) $(CXX)
NVCCC = $(if $(CCACHE),CCACHE_NOHASHDIR=true $(CCACHE)) $(NVCC)
DEBUG_PREFIX_MAP := -fdebug-prefix-map=$(CURDIR)=.
HASH := \#
NVCC ?= $(CUDA_HOME)/bin/nvcc
# Open MPI: NCCL on the host runs on it, and every flavour's programs start with it (mpirun -np N).
# Flags from its wrapper compiler, read once per make run; only -I, -L and -l are kept, so nvcc
# takes them as they are. We use the C API only: OMPI_SKIP_MPICXX keeps mpi.h from pulling in
# the deprecated C++ bindings (which would need -lmpi_cxx).
MPI_COMPILE_FLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LINK_FLAGS := $(shell mpicc --showme:link 2>/dev/null)
ifeq ($(strip $(MPI_LINK_FLAGS)),)
  ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
    $(error mpicc not found: install Open MPI (./install-deps.sh installs libopenmpi-dev and openmpi-bin))
  endif
endif
MPI_INCLUDES := $(patsubst -I%,-isystem %,$(filter -I%,$(MPI_COMPILE_FLAGS))) -DOMPI_SKIP_MPICXX=1
MPI_LIBS := $(filter -L% -l%,$(MPI_LINK_FLAGS))

INCLUDES := -I. -isystem $(CUDA_HOME)/include $(MPI_INCLUDES)
WARNINGS := -Wall -Wextra -Werror

# SANITIZE=address (test-asan) builds the host flavour under ASan + UBSan in build/asan;
# SANITIZE=thread (test-tsan) under ThreadSanitizer in build/tsan, where host/ itself is not
# instrumented: the platform states CUDA's happens-before edges explicitly
# (host/sanitizer_hooks.h), so its own bookkeeping cannot hide a race.
#
# Debug information: line tables (-g1) by default, in every flavour. They give file:line in
# backtraces, sanitizer reports and profiles, and gdb's breakpoints and stepping by line; full
# information (-g: types and local variables) makes g++ take 35-45% longer on our heaviest
# translation units (test_train, test_lora: measured on this 2-core machine). `make DEBUG_INFO=-g`
# builds with it, in a folder of its own (build/<flavour>-g), so the two never mix.
DEBUG_INFO ?= -g1
# The plain flavours' optimisation (host, and cuda's plain C++), which the sanitizer flavours also
# use for Catch2's mains (below), so that the compiler cache serves one object to all of them.
PLAIN_OPT := -O2 $(DEBUG_INFO)
PLATFORM_SAN :=
ifeq ($(SANITIZE),address)
  override BACKEND := host
  FLAVOUR := asan
  # GCC 12 reports false maybe-uninitialized warnings inside libstdc++ (std::regex, std::function)
  # when the sanitizers instrument it; that one warning is not an error in this flavour.
  # UBSan without three of its checks, which cost 41% of this flavour's compile time
  # (trainer/run.cu: 56 s -> 33 s on this 2-core machine) and which the suite has otherwise:
  # alignment (the host platform asserts it at every vector access, kernels/vec.cuh, the one a GPU
  # faults on; the file readers' byte casts are fuzzed under clang's full UBSan, make fuzz), null
  # (a null dereference is ASan's SEGV report, with its stack) and vptr (dynamic type checks of
  # polymorphic objects, which the code barely has). Every other UBSan check stays.
  UBSAN_SKIP := alignment,null,vptr
  OPT := -O1 $(DEBUG_INFO) -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=$(UBSAN_SKIP) \
         -fno-sanitize-recover=undefined -Wno-error=maybe-uninitialized -Wno-maybe-uninitialized
  PLATFORM_SAN := $(OPT)
else ifeq ($(SANITIZE),thread)
  override BACKEND := host
  FLAVOUR := tsan
  OPT := -O1 $(DEBUG_INFO) -fno-omit-frame-pointer -fsanitize=thread -DPOLEVAULT_TSAN -Wno-error=tsan -Wno-tsan
  PLATFORM_SAN := -O1 $(DEBUG_INFO) -fno-omit-frame-pointer -DPOLEVAULT_TSAN
else ifneq ($(SANITIZE),)
  $(error SANITIZE must be address or thread (got '$(SANITIZE)'))
else
  FLAVOUR := $(BACKEND)
  OPT := $(PLAIN_OPT)
  PLATFORM_SAN := $(OPT)
endif
ifneq ($(DEBUG_INFO),-g1)
  FLAVOUR := $(FLAVOUR)$(subst $(eval) ,,$(DEBUG_INFO))
endif
BUILD := build/$(FLAVOUR)

# Libraries the product code itself needs (the tokenizer's Unicode pre-split; XXH3 file checksums), on
# both backends.
PRODUCT_LIBS := -lpcre2-8 -lxxhash

cxxflags = -std=c++20 $(1) $(WARNINGS) $(DEBUG_PREFIX_MAP) $(INCLUDES) $(DEPFLAGS)
HOST_CXXFLAGS := $(call cxxflags,$(OPT))
ifeq ($(BACKEND),cuda)
  # Machine code (SASS) for A100 (sm_80) and H100 (sm_90), plus the PTX of the newest of them,
  # which the driver compiles at load for any later GPU (B200 included: forward compatibility;
  # without it a newer GPU has "no kernel image"). The PTX comes from the same front-end pass as
  # that arch's SASS (code=[sm_90,compute_90]), so it costs no third compile. -lineinfo maps SASS
  # back to source lines for profilers and compute-sanitizer, at no run-time cost.
  # Override to add targets, at build time: make BACKEND=cuda SASS_ARCHS="80 90 100" adds B200's
  # SASS (where this nvcc knows sm_100; each arch adds about half the device-code compile time).
  # CI builds SASS_ARCHS=90: its CUDA build is a compile-and-link check, for which one real
  # architecture plus its PTX is enough (one device-code pass per file instead of two). A SASS_ARCHS other
  # than the default builds in a folder of its own (build/cuda-sm90), so objects never mix archs.
  SASS_ARCHS ?= 80 90
  ifneq ($(strip $(SASS_ARCHS)),80 90)
    FLAVOUR := $(FLAVOUR)$(subst $(eval) ,,$(foreach a,$(SASS_ARCHS),-sm$(a)))
    BUILD := build/$(FLAVOUR)
  endif
  # nvcc's -O is the host code's optimisation (device code is optimised whatever it says). CI's
  # compile-and-link check builds with CUDA_HOST_OPT=-O0: 14-16% less nvcc time per file, the same device
  # code, every warning but the few g++ finds only while optimising, which the host flavour's -O2
  # build of the same sources reports. Another level builds in a folder of its own.
  CUDA_HOST_OPT ?= -O2
  ifneq ($(CUDA_HOST_OPT),-O2)
    FLAVOUR := $(FLAVOUR)$(CUDA_HOST_OPT)
    BUILD := build/$(FLAVOUR)
  endif
  # The device code's optimisation: NVVM (cicc) at -O3 and ptxas at -O3 unless CUDA_DEVICE_OPT=-O0
  # says otherwise, which CI's compile-and-link check uses: the same front end (every error and
  # warning of the device code's C++ comes from it), the same PTX instructions and resource checks
  # in ptxas, unoptimised: test/test_attention.cu's cicc 16.6 s -> 3.8 s and ptxas 10.9 s -> 5.5 s;
  # CI's whole CUDA build, uncached on this 2-core machine, 9:39 -> 8:31 (nvcc's compiles 694 s ->
  # 583 s; most files' time is host code). -G passes cicc the same -O0 and adds debug information.
  # Nothing runs what it builds: code for a GPU is built without it. Another level builds in a
  # folder of its own.
  CUDA_DEVICE_OPT ?= -O3
  ifneq ($(CUDA_DEVICE_OPT),-O3)
    FLAVOUR := $(FLAVOUR)-device$(CUDA_DEVICE_OPT)
    BUILD := build/$(FLAVOUR)
  endif
  PTX_ARCH := $(lastword $(SASS_ARCHS))
  GENCODE := $(foreach a,$(filter-out $(PTX_ARCH),$(SASS_ARCHS)),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(PTX_ARCH),code=[sm_$(PTX_ARCH),compute_$(PTX_ARCH)]
  CU := $(NVCCC) -x cu -std=c++20 $(CUDA_HOST_OPT) $(addprefix -Xcicc ,$(CUDA_DEVICE_OPT)) $(addprefix -Xptxas ,$(CUDA_DEVICE_OPT)) \
        -lineinfo $(GENCODE) -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
        $(INCLUDES) $(DEPFLAGS)
  LINK := $(NVCC) $(GENCODE)
  BACKEND_LIBS := -lcublas -lcudart -lnccl $(MPI_LIBS) $(PRODUCT_LIBS)
  PLATFORM_OBJS :=
else
  CU := $(CXXC) -x c++ $(HOST_CXXFLAGS)
  LINK := $(CXX) $(OPT) -rdynamic
  BACKEND_LIBS := -lopenblas -lpthread -ldl $(MPI_LIBS) $(PRODUCT_LIBS)
  PLATFORM_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(wildcard host/*.cpp)) $(BUILD)/host/fiber_switch.o
endif

# Product code shared by every program: CUDA C++ (.cu, through the flavour's compiler) and plain
# host C++ (.cpp: data pipeline, tokenizer, file formats; always g++).
PRODUCT_OBJS := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard platform/device_memory.cu model/*.cu optim/*.cu parallel/*.cu)) \
                $(patsubst %.cpp,$(BUILD)/%.o,$(wildcard data/*.cpp formats/*.cpp io/*.cpp model/*.cpp optim/*.cpp parallel/*.cpp))
CORE_OBJS := $(PRODUCT_OBJS) $(PLATFORM_OBJS)
# Tests and benchmarks link the product code from an archive, so each binary holds only the objects
# it uses (smaller binaries, quicker links). Nothing in product code registers itself from a static
# initialiser, which an archive would drop; host/ (whose objects do hold such hooks, e.g. the
# sanitizer suppressions) is linked as objects. The tsan flavour archives only what its kernel
# suites use (TSAN_PRODUCT_OBJS below): it compiles no other product object, and one missing from
# that list is a link error naming its symbol.
PRODUCT_LIB := $(BUILD)/libpolevault.a
# What test-tsan's suites call (the NF4 fixtures are safetensors files); the kernels themselves are
# templates their own translation units instantiate, under ThreadSanitizer, except attention's,
# compiled once in model/attention_kernels.o (kernels/attention_instances.h), also under it.
TSAN_PRODUCT_OBJS := $(addprefix $(BUILD)/,io/checksum.o io/durable_file.o io/input_file.o io/progress.o formats/safetensors.o \
                       model/attention_kernels.o)
CORE_LIBS := $(PRODUCT_LIB) $(PLATFORM_OBJS)

# Suites are .cu when they launch kernels or use the platform, .cpp when they are plain host C++
# (file formats, tokenizers, whole `train` programs): those compile with g++ in every flavour, so
# the cuda and host flavours share their objects through the compiler cache.
TEST_SOURCES := $(wildcard test/test_*.cu test/test_*.cpp)
TEST_BINS := $(patsubst test/%,$(BUILD)/test/%,$(basename $(TEST_SOURCES)))
TEST_SUPPORT := $(BUILD)/test/catch_main.o $(BUILD)/test/child_process.o
# Multi-rank suites: test/mpi/test_mpi_*.cu with a Catch2 main that starts MPI and agrees on one
# verdict across ranks; the runner starts each under mpirun at the rank counts below.
MPI_TEST_BINS := $(patsubst test/mpi/%.cu,$(BUILD)/test/mpi/%,$(wildcard test/mpi/test_mpi_*.cu))

# What `make test` runs, and under which schedules (SCHEDULES below). The kernel and unit suites
# run under every schedule of the flavour. The suites whose cost is whole models or whole `train`
# programs run under fewer: their kernels meet every schedule in their own suites, so another
# schedule repeats assertions already made; `make test-full` (FULL=1) runs every suite under every
# schedule, and the multi-rank suites at 2 and 4 ranks under each (docs/testing.md, "Which schedules
# each suite meets" lists it).
#   host   test_model and test_train: random+deferred (the order
#          that finds the most: threads and blocks shuffled, streams deferred item by item);
#          test_failures and test_learning (the program's behaviour on bad input, signals, full
#          disks; a model must learn): in-order; every multi-rank suite at 4 ranks:
#          random+deferred; the plain C++ suites that start no `train` program (file formats,
#          tokenizers, options, the planner's arithmetic: SCHEDULE_FREE_BINS) once, in-order: they
#          launch no kernel and create no stream, so a schedule changes nothing they run.
#   asan   every suite under random+deferred, the schedule that exposes lifetime bugs (a buffer
#          freed or reused before a stream has run the work that reads it); multi-rank suites at
#          2 ranks; test_learning (all [learning]) not at all.
#   cuda   every suite once (a GPU has no schedules).
RD := random+deferred
under = $(foreach l,$(2),$(l)@$(1))
SCHEDULE_FREE_BINS := $(patsubst test/%.cpp,$(BUILD)/test/%,$(shell grep -LE 'train_runner\.h|build_dir\(\)' test/test_*.cpp))
HOST_SCHEDULES_OF = $(strip \
  $(if $(filter $(1),$(BUILD)/test/test_model),$(RD)) \
  $(if $(filter $(1),$(SCHEDULE_FREE_BINS)),in-order) \
  $(if $(filter $(BUILD)/test/test_train%,$(1)),$(RD)) \
  $(if $(filter $(BUILD)/test/test_failures% $(BUILD)/test/test_learning,$(1)),in-order) \
  $(if $(filter mpi:4:%,$(1)),$(RD)))
runs_of = $(or $(call under,$(1),$(2)),$(1))
MPI_TEST_RANKS := $(if $(filter asan,$(FLAVOUR)),2,2 4)
MPI_TEST_SPECS := $(foreach n,$(MPI_TEST_RANKS),$(addprefix mpi:$(n):,$(MPI_TEST_BINS)))
# test_mpi_parallel at 2 ranks is make test-asan's (every case, under random+deferred, as here,
# with the sanitizers); make test runs it at 4 ranks, and test-full at 2 as well.
ifeq ($(FULL)$(FLAVOUR),host)
  MPI_TEST_SPECS := $(filter-out mpi:2:$(BUILD)/test/mpi/test_mpi_parallel,$(MPI_TEST_SPECS))
endif
ONE_RANK_BINS := $(if $(filter asan,$(FLAVOUR)),$(filter-out $(BUILD)/test/test_learning,$(TEST_BINS)),$(TEST_BINS))
# The runner runs TEST_JOBS suites at once (default: one per core), the slowest first, except
# what involves time, which runs alone (--alone): the stall watchdog (test_collective_watch), the
# multi-rank jobs (under MPI_TEST_TIMEOUT), and the [timed] cases of the whole-`train` suites
# (test_failures, test_train: signals, stalled ranks, a second writer, a failure that must end every
# rank within a bound), whose other cases share the pool (run_tests.sh's PATH~[timed]). The asan
# flavour leaves test_train's [timed] cases out ([mpi]), so runs it whole in the pool.
TEST_JOBS ?= $(shell nproc)
TIMED_BINS := $(BUILD)/test/test_collective_watch
SPLIT_BINS := $(addprefix $(BUILD)/test/,test_failures $(if $(filter asan,$(FLAVOUR)),,test_train))
SLOWEST_BINS := $(addprefix $(BUILD)/test/,test_train test_attention test_model test_failures test_learning test_lora)
PARALLEL_BINS := $(filter-out $(TIMED_BINS),$(foreach b,$(SLOWEST_BINS),$(filter $(b),$(ONE_RANK_BINS))) $(filter-out $(SLOWEST_BINS),$(ONE_RANK_BINS)))
PARALLEL_BINS := $(foreach b,$(PARALLEL_BINS),$(b)$(if $(filter $(b),$(SPLIT_BINS)),~[timed]))
# test_attention's [plain-bf16] case (the tensor cores' bf16 error against plain bf16 attention at T
# up to 4096: arithmetic, 25 s on this machine, mostly its fp64 reference) runs once, in order, not
# under every schedule; [heavy] keeps it out of ASan.
PLAIN_BF16 := $(BUILD)/test/test_attention[plain-bf16]
PARALLEL_BINS := $(foreach b,$(PARALLEL_BINS),$(b)$(if $(filter $(b),$(BUILD)/test/test_attention),~[plain-bf16]))
ORDERED_SPECS := $(PARALLEL_BINS) --alone $(filter $(TIMED_BINS),$(ONE_RANK_BINS)) $(addsuffix [timed],$(SPLIT_BINS)) \
                 $(MPI_TEST_SPECS)
ifeq ($(FULL)$(FLAVOUR),host)
  TEST_RUNS := in-order@$(PLAIN_BF16) \
               $(foreach b,$(ORDERED_SPECS),$(if $(filter --alone,$(b)),$(b),$(call runs_of,$(b),$(call HOST_SCHEDULES_OF,$(b)))))
else ifeq ($(FULL)$(FLAVOUR),asan)
  TEST_RUNS := $(foreach b,$(ORDERED_SPECS),$(if $(filter --alone,$(b)),$(b),$(RD)@$(b)))
else
  TEST_RUNS := $(PLAIN_BF16) $(ORDERED_SPECS)
endif
# The traffic test runs in the plain host flavour only, under one schedule (what it measures does
# not depend on the order threads run in).
TRAFFIC_TEST := $(if $(filter host,$(FLAVOUR)),$(BUILD)/test/traffic/test_kernel_traffic)
TEST_RUNS := $(if $(TRAFFIC_TEST),in-order@$(TRAFFIC_TEST)) $(TEST_RUNS)
# The benchmarks that run kernels, at the smallest shapes (test/bench_smoke.cpp), in the plain host
# flavour only (what they run, the sanitizer flavours run in the kernel suites), under every schedule,
# in the pool (a few seconds).
SMOKED_BENCHES := $(addprefix $(BUILD)/bench/,kernels_bench decode_bench)
BENCH_SMOKE := $(if $(filter host,$(FLAVOUR)),$(BUILD)/test/bench_smoke)
TEST_RUNS := $(BENCH_SMOKE) $(TEST_RUNS)
BENCH_BINS := $(patsubst bench/%.cu,$(BUILD)/bench/%,$(wildcard bench/*.cu)) \
              $(patsubst bench/%.cpp,$(BUILD)/bench/%,$(wildcard bench/*.cpp))

.PHONY: all tests benches everything test test-full test-asan test-tsan tsan-suite test-interop bench ptxas-report attention-sass sass-check format clean print-build-dir
.SECONDARY:
.DEFAULT_GOAL := all

# `make` builds what the README's first command runs and nothing else (a fresh 2-core machine
# reaches train's first step sooner); `make test` builds the tests it runs; CI's CUDA build is
# `make everything`, every program of the flavour compiled and linked.
all: train demo
tests: $(TEST_BINS) $(MPI_TEST_BINS) $(TRAFFIC_TEST) $(if $(BENCH_SMOKE),$(BENCH_SMOKE) $(SMOKED_BENCHES))
benches: $(BENCH_BINS)
everything: all tests benches

# Programs are linked per flavour in build/<flavour>/; ./train and ./demo are links to the flavour
# built last (so `make BACKEND=cuda` then `make test` never leaves a stale binary behind).
.PHONY: train demo
train demo: %: $(BUILD)/%
	ln -sf $< $@

$(BUILD)/demo: $(BUILD)/platform/demo.o $(CORE_OBJS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS)

# The train program: trainer/ (main, options, run state, checkpoints, generation, the trainer),
# the built-in corpus and the product code.
# Run files (train --run run.yaml, trainer/run_file.h) are read with yaml-cpp.
TRAIN_OBJS := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard trainer/*.cu)) $(patsubst %.cpp,$(BUILD)/%.o,$(wildcard trainer/*.cpp))
TRAIN_LIBS := -lyaml-cpp
$(BUILD)/train: $(TRAIN_OBJS) $(BUILD)/corpus.o $(CORE_OBJS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS) $(TRAIN_LIBS)

# train --version: the commit (`git describe --always --dirty` where this is a git checkout, .git
# being a folder or a worktree's file; "unknown" elsewhere, e.g. a tarball, without asking git,
# which would otherwise describe an enclosing repository) and the backend. Only
# trainer/version.o holds them; the stamp changes, and so rebuilds it, only when they change.
POLEVAULT_VERSION := $(if $(wildcard .git),$(shell git describe --always --dirty 2>/dev/null),)
POLEVAULT_VERSION := $(or $(POLEVAULT_VERSION),unknown)
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(dir $@)
	@echo '$(POLEVAULT_VERSION) $(BACKEND)' | cmp -s - $@ || echo '$(POLEVAULT_VERSION) $(BACKEND)' > $@
$(BUILD)/trainer/version.o: $(BUILD)/version.stamp
$(BUILD)/trainer/version.o: HOST_CXXFLAGS += -DPOLEVAULT_VERSION='"$(POLEVAULT_VERSION)"' -DPOLEVAULT_BACKEND='"$(BACKEND)"'
.PHONY: FORCE
FORCE:

# test_run_file checks the train program's own option parsing and --parallel auto's search
# request in process: it links the trainer's option objects (plain C++) besides the product code.
OPTION_OBJS := $(addprefix $(BUILD)/trainer/,options.o option_rules.o option_table.o run_file.o version.o auto_layout.o)
$(BUILD)/test/test_run_file: $(BUILD)/test/test_run_file.o $(OPTION_OBJS) $(TEST_SUPPORT) $(CORE_LIBS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS) $(TRAIN_LIBS)

# The built-in corpus of `train`: the project's own README, docs/*.md and headers, concatenated in a fixed
# order and embedded with .incbin (pv_corpus_begin .. pv_corpus_end).
CORPUS_FILES := README.md $(sort $(wildcard docs/*.md)) $(sort $(wildcard kernels/*.cuh platform/*.h model/*.h formats/*.h host/*.h parallel/*.h data/*.h io/*.h optim/*.h trainer/*.h))
$(BUILD)/corpus.txt: $(CORPUS_FILES)
	@mkdir -p $(dir $@)
	cat $^ > $@

$(BUILD)/corpus.o: $(BUILD)/corpus.txt
	printf '.section .rodata\n.globl pv_corpus_begin\n.globl pv_corpus_end\npv_corpus_begin:\n.incbin "%s"\npv_corpus_end:\n.byte 0\n.section .note.GNU-stack,"",@progbits\n' $< \
	  | $(CXX) -x assembler -c - -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CU) -c $< -o $@

# The CPU AdamW of the offloaded optimizer (optim/adamw_cpu.h) vectorises only at -O3 and without
# errno from sqrt: the same results bit for bit (no reassociation; no FMA contraction without
# -mfma), several times the elements per second (bench/adamw_cpu_bench).
ADAMW_CPU_FLAGS := -O3 -fno-math-errno
$(BUILD)/optim/adamw_cpu.o: CU += $(if $(filter cuda,$(BACKEND)),$(addprefix -Xcompiler ,$(ADAMW_CPU_FLAGS)),$(ADAMW_CPU_FLAGS))

$(BUILD)/host/%.o: host/%.cpp
	@mkdir -p $(dir $@)
	$(CXXC) -std=c++20 $(PLATFORM_SAN) $(WARNINGS) $(DEBUG_PREFIX_MAP) $(INCLUDES) $(DEPFLAGS) -c $< -o $@

$(BUILD)/host/fiber_switch.o: host/fiber_switch.S
	@mkdir -p $(dir $@)
	$(CXX) -c $< -o $@

# In the sanitizer flavours the tests' own code is not instrumented wherever no kernel of theirs
# runs: the code they check is the product's, compiled at -O1 and instrumented, and ASan + UBSan at
# -O1 take two to three times as long (test_train.cpp: 42 s against 14 s; test_mpi_parallel.cu:
# 52 s against 25 s). That is the plain C++ suites (test/*.cpp: file formats, tokenizers, whole
# `train` programs, the child-process helper) and the .cu suites that include no kernel header
# (kernels/<op>.cuh) and define no __global__ function of their own (models, checkpoints,
# multi-rank strategies: their kernels are the product's). In the asan flavour both compile exactly
# as in the host flavour, so the compiler cache serves the host flavour's objects (CI builds that
# one first): the kernel-free .cu suites cost ASan's build 138 s of compile time at -O0 with the
# sanitizers, on this 2-core machine. In the tsan flavour (which builds kernel suites only) they
# would compile at -O0. The kernel suites stay at -O1, instrumented, where their kernels run.
# Catch2's mains (its implementation; the multi-rank one adds a short harness that agrees on a
# verdict across ranks) compile at -O1 in every flavour, uninstrumented, one object for all of them:
# -O2 took 23 s against 15 s each, for no speed a suite shows. The multi-rank main finds
# LeakSanitizer's entry point by a weak symbol, so the same object calls it in the asan flavour.
#
# The product's JSON readers and writers (plain C++ that includes nlohmann/json: options, run
# state, checkpoint manifests, configs, safetensors headers, plots, chat examples) compile at -O0
# there too: nlohmann's templates are most of their compile time (trainer/options.cpp: 31 s
# against 17 s), and they run once per file or per run. The tokenizer's (data/tokenizer*.cpp) stay
# at -O1: its suites load 128k-entry vocabularies and encode whole corpora.
JSON_PRODUCT_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(filter-out data/tokenizer%,\
  $(shell grep -l nlohmann data/*.cpp formats/*.cpp io/*.cpp model/*.cpp optim/*.cpp parallel/*.cpp trainer/*.cpp)))
# The Jinja parser too (its evaluator includes nlohmann for tojson): chat templates are parsed once
# per prepare, and test_jinja's long loop is left out of the ASan build ([heavy]).
JSON_PRODUCT_OBJS += $(BUILD)/data/jinja_parse.o
CATCH_MAINS := $(BUILD)/test/catch_main.o $(BUILD)/test/catch_mpi_main.o
KERNEL_FREE_SUITES := $(shell for f in test/*.cu test/mpi/*.cu; do \
  grep -E '__global__|^$(HASH)include "kernels/' $$f | grep -qv 'kernels/common.cuh' || echo $$f; done)
# The plain C++ suites (test/*.cpp: file formats, tokenizers, options, whole `train` programs)
# compile at -O0 in every flavour: the code they run is the product's, compiled as the flavour
# compiles it, and Catch2's assertions at -O2 cost 2-3x the compile time (test_failures.cpp: 50 s
# against 123 s on a busy 2-core machine) for no speed the suites show.
# In the sanitizer flavours they compile exactly as in the host flavour, uninstrumented, so the
# compiler cache serves the host flavour's objects (CI builds that one first): what they drive is
# the product's objects and the `train` program, instrumented, and a suite's own code is drivers and
# expectations (instrumenting it cost the ASan build 156 s of compile time on this machine).
PLAIN_SUITE_OBJS := $(filter-out $(CATCH_MAINS),$(patsubst test/%.cpp,$(BUILD)/test/%.o,$(wildcard test/*.cpp)))
$(PLAIN_SUITE_OBJS): HOST_CXXFLAGS += -O0
$(CATCH_MAINS): HOST_CXXFLAGS := $(call cxxflags,-O1 $(DEBUG_INFO))
KERNEL_FREE_SUITE_OBJS := $(patsubst test/%.cu,$(BUILD)/test/%.o,$(KERNEL_FREE_SUITES))
ifeq ($(SANITIZE),address)
$(KERNEL_FREE_SUITE_OBJS): CU := $(CXXC) -x c++ $(call cxxflags,$(PLAIN_OPT))
else ifneq ($(SANITIZE),)
$(KERNEL_FREE_SUITE_OBJS): CU += -O0
endif
ifneq ($(SANITIZE),)
$(JSON_PRODUCT_OBJS): HOST_CXXFLAGS += -O0
$(PLAIN_SUITE_OBJS): HOST_CXXFLAGS := $(call cxxflags,$(PLAIN_OPT)) -O0
endif

# Catch2's main, the child-process helper, the train program's host parts and the host-only
# product code are plain C++ for every flavour (host/ has its own rule above: the platform's flags).
$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXXC) $(HOST_CXXFLAGS) -c $< -o $@

$(BUILD)/test/%: $(BUILD)/test/%.o $(TEST_SUPPORT) $(CORE_LIBS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS)

# test_kernel_traffic (host flavour only) holds the performance model's bytes against what the
# kernels touch: its translation unit is compiled with GCC's ThreadSanitizer instrumentation but
# linked without its runtime, so every read and write of its kernels reaches the traffic meter
# (host/access_meter.h) through our callbacks (test/traffic/access_hooks.cpp). It links no product object that instantiates kernels, so the
# instrumented instantiations are the ones that run.
TRAFFIC_FLAGS := -fsanitize=thread -Wno-error=tsan -Wno-tsan
TRAFFIC_OBJS := $(BUILD)/test/traffic/access_hooks.o $(BUILD)/platform/device_memory.o $(addprefix $(BUILD)/model/,step_cost.o flops.o config.o parameters.o lora.o nf4_layout.o \
                tensor_parallel.o activations.o grid_dispatch.o)
$(BUILD)/test/traffic/test_kernel_traffic.o: test/traffic/test_kernel_traffic.cu
	@mkdir -p $(dir $@)
	$(CU) $(TRAFFIC_FLAGS) -c $< -o $@

$(BUILD)/test/traffic/test_kernel_traffic: $(BUILD)/test/traffic/test_kernel_traffic.o $(TRAFFIC_OBJS) $(TEST_SUPPORT) $(PLATFORM_OBJS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS)

$(BUILD)/test/mpi/%: $(BUILD)/test/mpi/%.o $(BUILD)/test/catch_mpi_main.o $(BUILD)/test/child_process.o $(CORE_LIBS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(CORE_LIBS)
	$(LINK) -o $@ $^ $(BACKEND_LIBS)

$(PRODUCT_LIB): $(if $(filter tsan,$(FLAVOUR)),$(TSAN_PRODUCT_OBJS),$(PRODUCT_OBJS))
	rm -f $@ && ar rcs $@ $^

# Tests tagged [host-only] exercise diagnostics a GPU cannot give (a divergent barrier hangs a
# GPU); [asan] ones need the sanitizer build; [learning] (a model must learn within a step budget)
# tests optimisation, not memory, and is too slow under ASan, as are the [mpi] runs of the train
# binary under mpirun (the strategies themselves run under ASan in test/mpi/) and the [heavy]
# cases: the whole-model gradient check (numerics: the same forward and backward run under ASan in
# the other test_model cases), the tokenizer goldens on all of tinyshakespeare (the same code
# runs under ASan on its slices), test_train's same-seed determinism (three plain runs: the
# tiny run's code path, which runs under ASan) and its `train plan` case (the planner's figures
# against the device's accounting, and its search: that code runs under ASan in test_plan,
# test_layout_search and test_mpi_planner, and the default model's training in every train run
# there). Hidden tests ([.], the planted bugs' child runs)
# are excluded explicitly: Catch2 v2 runs hidden tests under a filter made only of exclusions.
ifeq ($(BACKEND),cuda)
  TEST_FILTER := ~[.]~[host-only]~[asan]~[tsan]
else ifeq ($(FLAVOUR),asan)
  TEST_FILTER := ~[.]~[tsan]~[learning]~[mpi]~[heavy]
else ifeq ($(FLAVOUR),tsan)
  # The gradient checks rerun the kernels their suites' reference cases run at the same tiny
  # shapes, hundreds of times for the numerics (which `make test` checks under three schedules):
  # no new race to find, and most of the suite's time under TSan. So are the [numerics] cases
  # (cross-entropy at a 128k vocabulary, logits that overflow a naive exp): the same kernels the
  # reference cases race-check, at shapes chosen for their arithmetic.
  TEST_FILTER := ~[.]~[asan]~[schedules]~[gradcheck]~[numerics]
else
  TEST_FILTER := ~[.]~[asan]~[tsan]
endif

# The host suites run under several schedules (host/schedule.h, host/stream.cpp): threads and
# blocks in order, synchronous streams; warp-greedy threads with reversed blocks and streams
# deferred in bursts (one stream runs far ahead of another); random threads and blocks with
# deferred streams interleaved item by item. The sanitizer flavours use the first and the last.
S_IN_ORDER := --schedule 'in-order:'
S_WARP_GREEDY := --schedule 'warp-greedy+bursts:POLEVAULT_HOST_THREAD_ORDER=warp-greedy,POLEVAULT_HOST_BLOCK_ORDER=reverse,POLEVAULT_HOST_SEED=1,POLEVAULT_HOST_STREAMS=bursts'
S_RANDOM := --schedule 'random+deferred:POLEVAULT_HOST_THREAD_ORDER=random,POLEVAULT_HOST_BLOCK_ORDER=random,POLEVAULT_HOST_SEED=2,POLEVAULT_HOST_STREAMS=deferred'
ifeq ($(FLAVOUR),host)
  SCHEDULES := $(S_IN_ORDER) $(S_WARP_GREEDY) $(S_RANDOM)
else ifneq ($(SANITIZE),)
  SCHEDULES := $(S_IN_ORDER) $(S_RANDOM)
endif
# test-tsan checks the kernel suites (where shared-memory races live) at their small shapes, the
# slowest first.
# test_cross_entropy without its [launches] cases (the vocabulary-parallel sweeps: dozens of
# launches of kernels the suite's other cases also run, at ~0.3 s a launch under TSan).
TSAN_TESTS := $(addprefix $(BUILD)/test/,test_rmsnorm test_attention test_cross_entropy test_nf4 test_kernels_platform \
  test_warp_mma test_attention_decode test_planted_races)
TSAN_RUNS := $(patsubst %/test_cross_entropy,%/test_cross_entropy~[launches],$(TSAN_TESTS))
TSAN_OPTIONS_ := TSAN_OPTIONS='halt_on_error=0 exitcode=66 history_size=4'

test: $(TEST_BINS) $(MPI_TEST_BINS) $(TRAFFIC_TEST) $(if $(BENCH_SMOKE),$(BENCH_SMOKE) $(SMOKED_BENCHES)) $(BUILD)/train
	@test/run_tests.sh --jobs $(TEST_JOBS) --filter '$(TEST_FILTER)$(if $(FULL),$(comma)[full])' $(SCHEDULES) $(foreach r,$(TEST_RUNS),'$(r)')

# The full cross-product: every suite under every schedule and rank count, plus the hidden [full]
# cases (make test-asan FULL=1 and make test-tsan FULL=1 are the same for those flavours).
test-full:
	@$(MAKE) --no-print-directory FULL=1 test
comma := ,

test-asan:
	@$(MAKE) --no-print-directory SANITIZE=address test

test-tsan:
	@$(MAKE) --no-print-directory SANITIZE=thread tsan-suite

# Under random+deferred only (in-order too with FULL=1): ThreadSanitizer reports a race from the
# happens-before order, which the thread order does not change, and only deferred streams run a
# stream's work on a thread of its own, where a missing cudaStreamWaitEvent is a race it can see.
tsan-suite: $(TSAN_TESTS)
	@$(TSAN_OPTIONS_) test/run_tests.sh --jobs $(TEST_JOBS) --filter '$(TEST_FILTER)' $(SCHEDULES) $(if $(FULL),$(TSAN_TESTS),$(addprefix $(RD)@,$(TSAN_RUNS)))

# The interop suite runs the host flavour's train whatever BACKEND is; test/interop/run.sh makes
# the virtual environment on first use (and again only when requirements.txt changes).
# `make test` never needs it.
INTEROP_VENV := build/interop-venv
test-interop:
	@$(MAKE) --no-print-directory BACKEND=host DEBUG_INFO=-g1 build/host/train
	@test/interop/run.sh $(INTEROP_VENV)

ptxas-report:
	@bench/ptxas_report.sh

# The tensor-core attention kernels' tile loops, instructions per warp and trip, which the
# performance model turns into time (model/attention_sass.h, written by bench/attention_sass.py):
# attention-sass rewrites the file from the kernels' SASS; sass-check (CI's CUDA step) runs
# ptxas-report's checks and fails when the file no longer matches the kernels, so a kernel change
# cannot leave the model's figures behind. The counts are one compiler's (the file names it): under
# another nvcc, sass-check shows how its counts differ and fails only on ptxas-report's checks.
attention-sass:
	@bench/ptxas_report.sh --attention-header model/attention_sass.h
sass-check:
	@mkdir -p build
	@bench/ptxas_report.sh --attention-header build/attention_sass.h > build/ptxas-report.txt || \
	  { cat build/ptxas-report.txt; echo "sass-check: ptxas-report failed (above)"; exit 1; }
	@if [ "$$(grep '^// nvcc: ' build/attention_sass.h)" != "$$(grep '^// nvcc: ' model/attention_sass.h)" ]; then \
	  diff model/attention_sass.h build/attention_sass.h || true; \
	  echo "sass-check: model/attention_sass.h was made by another nvcc: its counts not compared (above: this one's)"; \
	elif ! cmp -s build/attention_sass.h model/attention_sass.h; then \
	  diff model/attention_sass.h build/attention_sass.h; \
	  echo "sass-check: the attention kernels' SASS no longer gives model/attention_sass.h's figures:" \
	       "run make attention-sass and commit the file"; exit 1; \
	else echo "sass-check: model/attention_sass.h matches the attention kernels' SASS"; fi

bench: $(BENCH_BINS) $(BUILD)/train
	@for b in $(BENCH_BINS); do echo "== $$b"; POLEVAULT_HOST_WORKERS=1 OPENBLAS_NUM_THREADS=1 $$b || exit 1; done
	@echo "== bench/train_throughput.sh"; TRAIN=$(BUILD)/train bench/train_throughput.sh

# make fuzz: a libFuzzer target per file reader (fuzz/fuzz_*.cpp, fuzz/README.md), each run for
# FUZZ_SECONDS on its committed corpus fuzz/corpus/<reader>/ (CI's check: every seed replayed, then
# a brief search); make fuzz-long: each to 10^6 executions, the run whoever touches a reader makes. Built with clang (libFuzzer is
# clang's) under AddressSanitizer + UBSan, host C++ only: the readers and what they call, compiled
# again with the fuzzer's coverage instrumentation into build/fuzz/ and linked from an archive, so
# each target takes only the objects it needs (unused functions are dropped with their sections:
# trainer/options.o's command-line parser is not linked in with the options' JSON reader).
FUZZ_SECONDS ?= 10
FUZZ_CXX ?= clang++
FUZZ_BUILD := build/fuzz
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CXXFLAGS := -std=c++20 -O1 $(DEBUG_INFO) -fno-omit-frame-pointer $(FUZZ_SAN) -fsanitize=fuzzer-no-link \
                 -ffunction-sections -fdata-sections $(WARNINGS) $(DEBUG_PREFIX_MAP) $(INCLUDES) $(DEPFLAGS)
# Two of the objects include the host platform's headers, which clang 14 cannot compile
# (std::source_location needs a builtin it lacks): they are compiled by g++ under the same
# sanitizers (ASan's and UBSan's interfaces are the same in both compilers), without the
# fuzzer's coverage — the options' JSON reader is nlohmann's templates, instrumented in the
# objects that instantiate them too; the NF4 tables are constants.
FUZZ_GXX_OBJS := $(FUZZ_BUILD)/trainer/options.o $(FUZZ_BUILD)/model/bnb_tables.o
# The readers and what they call (a missing one is a link error naming its symbol).
FUZZ_LIB_SOURCES := $(addprefix data/,bpe.cpp chat.cpp examples.cpp jinja_eval.cpp jinja_parse.cpp pretokenize.cpp shard.cpp token_decoders.cpp \
                      tokenizer.cpp tokenizer_json.cpp utf8.cpp) $(addprefix io/,checksum.cpp durable_file.cpp input_file.cpp json_reader.cpp progress.cpp) \
                    $(addprefix formats/,bnb_checkpoint.cpp config_json.cpp dtype_conversion.cpp hf_checkpoint.cpp llama2c.cpp peft_config.cpp \
                      safetensors.cpp) \
                    $(addprefix model/,checkpoint.cpp checkpoint_files.cpp config.cpp flops.cpp lora.cpp nf4_layout.cpp parameters.cpp \
                      tensor_parallel.cpp) \
                    trainer/state.cpp trainer/option_rules.cpp parallel/mesh_shape.cpp parallel/plan.cpp parallel/schedule.cpp parallel/stages.cpp
FUZZ_LIB_OBJS := $(patsubst %.cpp,$(FUZZ_BUILD)/%.o,$(FUZZ_LIB_SOURCES)) $(FUZZ_GXX_OBJS)
FUZZ_BINS := $(patsubst fuzz/%.cpp,$(FUZZ_BUILD)/%,$(wildcard fuzz/fuzz_*.cpp))

.PHONY: fuzz fuzz-long
fuzz: $(FUZZ_BINS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh $(FUZZ_BINS)

fuzz-long: $(FUZZ_BINS)
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-2400} FUZZ_RUNS=$${FUZZ_RUNS:-1000000} fuzz/run.sh $(FUZZ_BINS)

$(FUZZ_BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CCACHE) $(FUZZ_CXX) $(FUZZ_CXXFLAGS) -c $< -o $@

FUZZ_GXX := $(CXXC) -x c++ -std=c++20 -O1 $(DEBUG_INFO) -fno-omit-frame-pointer $(FUZZ_SAN) -ffunction-sections -fdata-sections \
            $(WARNINGS) -Wno-maybe-uninitialized $(DEBUG_PREFIX_MAP) $(INCLUDES) $(DEPFLAGS)
$(FUZZ_BUILD)/trainer/options.o: trainer/options.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_GXX) -c $< -o $@

$(FUZZ_BUILD)/model/bnb_tables.o: model/bnb_tables.cu
	@mkdir -p $(dir $@)
	$(FUZZ_GXX) -c $< -o $@

# The targets find their fixed inputs (a tokenizer) in the repository's test data.
$(FUZZ_BUILD)/fuzz/%.o: FUZZ_CXXFLAGS += -DPV_FUZZ_DATA_DIR='"$(CURDIR)/test/data"'

$(FUZZ_BUILD)/libreaders.a: $(FUZZ_LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/fuzz/fuzz_%.o $(FUZZ_BUILD)/libreaders.a
	$(FUZZ_CXX) $(FUZZ_SAN) -fsanitize=fuzzer -Wl,--gc-sections -o $@ $^ $(PRODUCT_LIBS)

format:
	clang-format -i $$(git ls-files '*.cu' '*.cuh' '*.cpp' '*.h')

clean:
	rm -rf build demo train

# The build folder of the settings given (BACKEND, SASS_ARCHS, SANITIZE, DEBUG_INFO, ...), for
# scripts that run what a build made (bench/gpu_session.sh) without repeating the naming rule.
print-build-dir:
	@echo $(BUILD)

-include $(shell find build/$(FLAVOUR) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
