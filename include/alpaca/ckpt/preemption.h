// Preemption and interruption (what Slurm and people send), turned into a flag the step loop
// polls between optimizer steps:
//   SIGTERM, SIGUSR1  -> kSaveAndExit: finish the current optimizer step, save a checkpoint,
//                        exit with kExitPreempted (75, EX_TEMPFAIL of sysexits.h: "a complete
//                        checkpoint was saved, run the same command with
//                        --resume_from_checkpoint auto to continue"). It is distinct from 143
//                        (128 + SIGTERM), what a process killed by SIGTERM before it could save
//                        reports, so batch scripts requeue only on 75 (scripts/slurm/).
//   first SIGINT      -> kSaveAndExit too, exit kExitInterrupted (130).
//   second SIGINT     -> stops at once (_exit(130)) without saving; the last complete
//                        checkpoint stays valid because checkpoints are committed by rename.
// The flag is per process; the trainer all-reduces it (max) once per step so every rank stops
// at the same step even when only some ranks got the signal.
#pragma once

namespace alpaca::ckpt {

inline constexpr int kExitPreempted = 75;
inline constexpr int kExitInterrupted = 130;

enum class StopRequest : int { kNone = 0, kSaveAndExit = 1 };

// Installs the handlers (idempotent). The previous handlers are restored by uninstall.
void install_preemption_handlers();
void uninstall_preemption_handlers();

StopRequest stop_requested();
// The signal number that asked to stop (0 when none) and the exit code that goes with it.
int stop_signal();
int exit_code_for_stop(int signal_number);
// Marks a stop as requested, as if `signal_number` had arrived (tests, and the step loop when
// another rank got the signal).
void request_stop(int signal_number);
void clear_stop_request();

}  // namespace alpaca::ckpt
