// Preemption: what `train` does with SIGTERM, SIGINT, SIGHUP and SIGUSR1 (Slurm and most
// schedulers send SIGTERM before they kill a job; Ctrl-C is SIGINT; a closed terminal SIGHUP;
// SIGUSR1 is the usual "checkpoint and go" request), and SIGXFSZ.
//
// The phases of a run, each with its own answer to a stop signal:
//   loading   (set-up: reading data, building and loading the model): nothing is worth saving
//             yet; the handler prints a line and the process dies by the signal, as it would
//             without a handler.
//   training  (the step loop): the handler only records the signal in a lock-free flag. The run
//             loop reads the flag once per step, before the step, and the step's loss all-reduce
//             carries it to every rank (trainer/trainer.h, StepResult::stop_requests), so all
//             ranks stop after the same step, whether the signal reached one rank or all. That
//             step finishes, its checkpoint is written, the resume command is printed, exit 0.
//             A signal that arrives while a step runs is read before the next one: at most one
//             more step runs than the one in flight. A second signal ends the process at once
//             (_exit(128 + signo)), saying that no checkpoint was written for the step in flight;
//             the complete checkpoints before it are intact (a half-written step_N.tmp is never
//             resumed from and is removed by the next run: trainer/out_dir.h).
//   finished  (after the last step: the closing sample): the checkpoints are written; a signal
//             ends the process at once with a line saying so.
//
// Under Open MPI's mpirun. mpirun does not forward SIGINT or SIGTERM: interrupted (Ctrl-C) or
// terminated, it sends each rank SIGCONT, waits odls_base_sigkill_timeout seconds (T, 1 by
// default), sends SIGTERM, waits T again and sends SIGKILL (Open MPI 4's odls "kill local
// procs"), and it forwards none of the ranks' output meanwhile. Waiting for the SIGTERM would
// leave T seconds for the step and its checkpoint; so under Open MPI (OMPI_COMM_WORLD_SIZE set)
// a SIGCONT while training is taken as the stop request, 2T seconds before the SIGKILL, and the
// SIGTERM that follows it is the same request, not a second signal. The price: a SIGCONT sent by
// hand to a rank under mpirun (after a SIGSTOP, say) stops the run too, with its checkpoint.
// `mpirun --mca odls_base_sigkill_timeout 60` gives the ranks 120 s (docs/failures.md).
//
// The handler touches only async-signal-safe things: a std::atomic that is always lock-free,
// write(2) of preformatted strings, signal(2) and raise(3), _exit(2).
//
// SIGXFSZ (a write past RLIMIT_FSIZE, `ulimit -f`) is ignored from start-up, so such a write
// fails with EFBIG and reaches the caller as an error with a message (io/durable_file.h) instead
// of killing the process silently.
//
// Test hook: POLEVAULT_TEST_SIGNAL_AT_STEP=K makes the process raise SIGTERM at the run loop's
// read point of step K (1-based), a deterministic stand-in for `kill` (under mpirun, set it on one
// rank to signal that rank alone); K = 0 raises it at the end of loading, once the model is built
// and before a resumed run reads its checkpoint's state.
// Host code only.
#pragma once

namespace pv {

enum class SignalPhase { loading, training, finished };

// Every command: a write past RLIMIT_FSIZE fails with EFBIG instead of killing the process.
void ignore_file_size_signal();

// The training command: installs the stop signals' handler (phase: loading), before MPI starts.
void install_stop_signals();

// Whether this process is a rank that Open MPI's mpirun started (OMPI_COMM_WORLD_SIZE is set).
bool under_open_mpi();

// T above: the seconds mpirun waits between its SIGCONT, SIGTERM and SIGKILL
// (OMPI_MCA_odls_base_sigkill_timeout, which `mpirun --mca` also sets; 1 when unset).
int mpirun_kill_grace_seconds();

// Sets what the next stop signal does (see above).
void set_signal_phase(SignalPhase phase);

// The first stop signal received while training (its number), 0 if none: the run loop's read.
int stop_signal();

// "SIGTERM", "SIGINT", ... for a stop signal's number; "signal N" for another.
const char* signal_name(int signo);

// The test hook: raises SIGTERM as POLEVAULT_TEST_SIGNAL_AT_STEP asks when `step` (1-based; 0:
// loading) is its K.
void test_signal_hook(long long step);

}  // namespace pv
