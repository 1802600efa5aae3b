// Fault injection for tests: the one place production code asks whether a test wants a fault at a
// named point. Tests arm points through one environment variable, read once per process:
//
//   ALPACA_FAULTS="point[=value][,point[=value]...]"
//
// Points in use (each call site names its point; keep this list in step with the code):
//   ckpt.pause_before_seal=MS   every rank sleeps MS ms after writing its checkpoint files and
//                               before the checkpoint is sealed (kill-mid-write tests).
//                               With --save_async the pause is in the background writer.
//   ckpt.fail_write_rank=RANK   that rank's sharded checkpoint writes fail as on a full disk
//                               (ENOSPC), the other ranks' succeed (one-rank disk-full tests).
//   mem.cpu_cap_bytes=N         the counting CPU allocator (util/tensor_memory.h) refuses any
//                               allocation that would take live CPU tensor bytes above N, with
//                               c10::OutOfMemoryError (out-of-memory tests on CPU).
//   train.pause_after_step=MS   every rank sleeps MS ms after each optimizer step (tests that signal
//                               a run mid-training, e.g. tests/slurm, get a window that does not
//                               depend on the machine's speed).
//   train.pause_in_load=MS      every rank sleeps MS ms just before the model's weights are read
//                               (SIGTERM-during-load tests).
//   train.pause_in_eval=MS      every rank sleeps MS ms before each evaluation forward
//                               (SIGTERM-during-evaluation tests).
//   dist.exit_after_init=RANK   that rank _exits (code 3) right after MPI_Init, before any
//                               collective (a peer that dies before the first collective).
// A pause writes "ALPACA_FAULTS: <point> pauses MS ms" to stderr as it begins, so a test signals
// the run once that line is in its log, never after a guessed sleep.
// With ALPACA_FAULTS unset every query is a cheap lookup in an empty table. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace alpaca::util {

// The value armed for `point` ("" when it is named without "=value"); nullopt when not armed.
std::optional<std::string> fault_value(std::string_view point);
inline bool fault_armed(std::string_view point) { return fault_value(point).has_value(); }
// The armed value as an integer (`fallback` when the point is armed without a value); nullopt when
// not armed. A value that is not an integer is an error naming the point.
std::optional<int64_t> fault_int(std::string_view point, int64_t fallback = 0);
// Sleeps for the point's value in milliseconds when armed; returns at once otherwise.
void fault_pause_ms(std::string_view point);

}  // namespace alpaca::util
