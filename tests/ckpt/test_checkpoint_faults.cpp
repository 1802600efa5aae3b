// Broken machines and broken files around checkpoints, with the real alpaca-train binary on the
// tiny parity model (CPU, one rank): a disk that fills during a save (a real tmpfs, mounted here
// when the test runs as root; skipped otherwise), a checkpoint that was truncated, had one byte
// flipped or lost its optimizer file, and an output directory that cannot be written.
#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "ckpt_test_util.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_checkpoint_faults {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("train_parity");

std::string run_args(const fs::path& out, int64_t max_steps) {
  return TrainFlags(kFixture, out).steps(max_steps).batch(4, 1).set("--learning_rate 1e-3 --save_steps 2");
}

int64_t dir_bytes(const fs::path& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

// A tmpfs of a given size at `dir`, unmounted when the test ends (whatever it asserts).
class Tmpfs {
 public:
  Tmpfs(const fs::path& dir, int64_t bytes, bool read_only = false) : dir_(dir) {
    fs::create_directories(dir);
    const std::string opts = "size=" + std::to_string(bytes);
    ok_ = ::mount("tmpfs", dir.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opts.c_str()) == 0;
    if (!ok_) error_ = std::strerror(errno);
  }
  ~Tmpfs() {
    if (ok_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  bool resize(int64_t bytes) {
    const std::string opts = "size=" + std::to_string(bytes);
    return ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) == 0;
  }

 private:
  fs::path dir_;
  bool ok_ = false;
  std::string error_;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "fixture skipped (no shared data)"

#define SKIP_WITHOUT_MOUNT(t) \
  if (!(t).ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << (t).error() << "; needs root)"

}  // namespace

TEST(CheckpointFaults, DiskFullDuringSaveKeepsPreviousCheckpointAndResumesOnceSpaceIsBack) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("disk_full");
  // How big one checkpoint of this run is, measured on the ordinary disk.
  std::string log;
  ASSERT_EQ(run_trainer(run_args(tmp.path() / "sizing", 2), 1, &log), 0) << log;
  const int64_t ckpt_bytes = dir_bytes(tmp.path() / "sizing" / "checkpoint-2");
  ASSERT_GT(ckpt_bytes, 100000);
  // Room for checkpoint-2 and the small files (page-rounded), but not for checkpoint-4 as well.
  const int64_t disk = (ckpt_bytes * 3 / 2 + 256 * 1024) / 4096 * 4096;
  const fs::path out = tmp.path() / "disk";
  Tmpfs fs_small(out, disk);
  SKIP_WITHOUT_MOUNT(fs_small);

  const int rc = run_trainer(run_args(out, 4), 1, &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  EXPECT_NE(log.find("bytes still to write"), std::string::npos) << log;
  EXPECT_NE(log.find("bytes are free on its filesystem"), std::string::npos) << log;
  EXPECT_NE(log.find((out / "tmp-checkpoint-4").string()), std::string::npos) << "the error names the file: " << log;
  EXPECT_NE(log.find("checkpoint-4 was not saved"), std::string::npos) << log;
  EXPECT_NE(log.find("a checkpoint of this run needs about"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "tmp-checkpoint-4")) << "no partial directory is left behind";
  EXPECT_FALSE(fs::exists(out / "checkpoint-4"));
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-2"), "") << "the previous checkpoint is intact";

  // Space is back: the same command with --resume_from_checkpoint True finishes the run.
  ASSERT_TRUE(fs_small.resize(disk * 8)) << std::strerror(errno);
  ASSERT_EQ(run_trainer(run_args(out, 4) + " --resume_from_checkpoint True", 1, &log), 0) << log;
  EXPECT_NE(log.find("resuming from " + (out / "checkpoint-2").string()), std::string::npos) << log;
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-4"), "");
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
}

TEST(CheckpointFaults, CorruptCheckpointIsRefusedNamingTheFile) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("corrupt_ckpt");
  const fs::path out = tmp.path() / "run";
  std::string log;
  // The gathered layout (its files are named below); test_sharded_resume damages sharded ones.
  ASSERT_EQ(run_trainer(run_args(out, 2) + " --save_checkpoint_layout gathered", 1, &log), 0) << log;
  const fs::path good = out / "checkpoint-2";
  ASSERT_EQ(alpaca::ckpt::checkpoint_problem(good), "");

  struct Case {
    const char* name;
    void (*damage)(const fs::path&);
    const char* expect;  // after the file's path in the error
  };
  const Case cases[] = {
      {"truncated", [](const fs::path& d) { fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2); },
       "model.safetensors has "},
      {"flipped byte", [](const fs::path& d) { flip_byte_near_end(d / "model.safetensors"); },
       "model.safetensors is corrupt: its xxh3_128 is"},
      {"missing optimizer", [](const fs::path& d) { fs::remove(d / "optimizer.safetensors"); }, "optimizer.safetensors is missing"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path bad = fresh_copy(good, tmp.path());
    c.damage(bad);
    // An explicit checkpoint: refused before any model is loaded, naming the file.
    int rc = run_trainer(run_args(tmp.path() / "resume_explicit", 4) + " --resume_from_checkpoint " + bad.string(), 1, &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(log.find("cannot be resumed from: file " + bad.string()), std::string::npos) << log;
    EXPECT_NE(log.find(c.expect), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(tmp.path() / "resume_explicit" / "checkpoint-4"));
    // True = the newest complete one: the damaged one is skipped with a warning naming it, and
    // with nothing else to resume from the run stops rather than starting over.
    rc = run_trainer(run_args(bad.parent_path(), 4) + " --resume_from_checkpoint True", 1, &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(log.find("skipping checkpoint " + bad.string()), std::string::npos) << log;
    EXPECT_NE(log.find("no complete checkpoint-<step>"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(bad.parent_path() / "checkpoint-4"));
  }
}

TEST(CheckpointFaults, UnwritableOutputDirIsAnErrorBeforeAnyLoading) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("unwritable_out");
  std::string log;
  // A regular file where the output directory should be.
  std::ofstream(tmp.path() / "a_file") << "not a directory";
  int rc = run_trainer(run_args(tmp.path() / "a_file", 2), 1, &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--output_dir"), std::string::npos) << log;
  EXPECT_NE(log.find((tmp.path() / "a_file").string()), std::string::npos) << log;
  EXPECT_EQ(log.find("loaded"), std::string::npos) << "nothing is loaded first: " << log;
  EXPECT_EQ(log.find("step 1"), std::string::npos) << log;
  // A read-only parent (a read-only tmpfs: root ignores permission bits, not a read-only mount).
  Tmpfs ro(tmp.path() / "ro", 1 << 20, /*read_only=*/true);
  SKIP_WITHOUT_MOUNT(ro);
  rc = run_trainer(run_args(tmp.path() / "ro" / "out", 2), 1, &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find((tmp.path() / "ro" / "out").string()), std::string::npos) << log;
  EXPECT_NE(log.find("Read-only file system"), std::string::npos) << log;
  EXPECT_EQ(log.find("loaded"), std::string::npos) << "nothing is loaded first: " << log;
}

TEST(CheckpointFaults, SigtermDuringSaveFinishesTheCheckpointAndExits75) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("sigterm_save");
  const fs::path out = tmp.path() / "run";
  fs::create_directories(out);
  // The save of checkpoint-2 pauses 3 s after its files are written, before it is sealed.
  BackgroundRun run = launch_trainer(run_args(out, 100), 1, tmp.path() / "run.log", "ckpt.pause_before_seal=3000");
  const bool staged = run.wait_until([&] { return fs::exists(out / "tmp-checkpoint-2" / "trainer_state.json"); });
  run.signal(SIGTERM);
  const int status = run.wait();
  const std::string log = run.log();
  ASSERT_TRUE(staged) << log;
  ASSERT_TRUE(WIFEXITED(status)) << "a clean exit, not death by the signal: " << log;
  EXPECT_EQ(WEXITSTATUS(status), 75) << log;  // EX_TEMPFAIL: stopped after a save (ckpt/preemption.h)
  // The save that was under way completes; nothing torn or half-staged stays.
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-2"), "") << log;
  EXPECT_FALSE(fs::exists(out / "tmp-checkpoint-2"));
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    EXPECT_NE(name.rfind("tmp-", 0), 0u) << "left behind: " << name;
    if (name.rfind("checkpoint-", 0) == 0) {
      EXPECT_EQ(alpaca::ckpt::checkpoint_problem(e.path()), "") << name;
    }
  }
}

// True once something listens on 127.0.0.1:port (rank 0's rendezvous store).
bool port_open(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// torchrun-style environment with WORLD_SIZE=3 but only ranks 0 and 1 started.
TEST(CheckpointFaults, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("rank_missing");
  const int timeout_s = 10;
  const int port = 20000 + ::getpid() % 20000;
  auto rank_cmd = [&](int r) {
    return "env RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
           trainer_command(run_args(tmp.path() / "out", 2) + " --ddp_timeout " + std::to_string(timeout_s), 1);
  };
  // Rank 0 first; rank 1 once rank 0's store listens, so a slow start of one process on a busy
  // machine is not mistaken for a missing rank. Rank 0's wait began at about that moment.
  BackgroundRun rank0(rank_cmd(0), tmp.path() / "rank0.log");
  ASSERT_TRUE(rank0.wait_until([&] { return port_open(port); })) << "rank 0 never opened its store";
  const auto t0 = std::chrono::steady_clock::now();
  std::string log1;
  const int rc1 = run_command(rank_cmd(1), &log1);
  const int status0 = rank0.wait();
  const double seconds = seconds_since(t0);
  const std::string logs[2] = {rank0.log(), log1};
  const int rcs[2] = {WIFEXITED(status0) ? WEXITSTATUS(status0) : 128 + WTERMSIG(status0), rc1};
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_NE(rcs[r], 0) << logs[r];
    EXPECT_NE(logs[r].find(" 2 of WORLD_SIZE=3 never connected to the rendezvous store at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << logs[r];
  }
  EXPECT_LT(seconds, timeout_s + 10) << "took " << seconds << " s";
  std::cout << "both ranks ended " << seconds << " s after rank 0's store opened (--ddp_timeout " << timeout_s << ")\n";
}

// ---- SIGTERM while the model loads and while evaluation runs (one rank; the pause points of
// util/fault.h give the signal a window that does not depend on the machine's speed).

namespace {

// No tmp-* staging directory is left in `out`, and every checkpoint there verifies (sizes and
// sha256 against checkpoint_complete.json). Returns how many checkpoints there are.
int expect_no_torn_checkpoint(const fs::path& out) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    EXPECT_NE(name.rfind("tmp-", 0), 0u) << "left behind: " << name;
    if (name.rfind("checkpoint-", 0) == 0) {
      ++n;
      EXPECT_TRUE(fs::exists(e.path() / "checkpoint_complete.json")) << name;
      EXPECT_EQ(alpaca::ckpt::checkpoint_problem(e.path()), "") << name;
    }
  }
  return n;
}

// SIGTERM to `run`, then its end: the wait status, and the seconds it took after the signal.
std::pair<int, double> stop_with_sigterm(BackgroundRun& run) {
  run.signal(SIGTERM);
  const auto t_sig = std::chrono::steady_clock::now();
  const int status = run.wait();
  return {status, seconds_since(t_sig)};
}

// A preempted run's end: a clean exit (not death by the signal) with code 75 (preemption.h).
void expect_preemption_exit(int status, const std::string& log) {
  ASSERT_TRUE(WIFEXITED(status)) << "a clean exit, not death by the signal: " << log;
  EXPECT_EQ(WEXITSTATUS(status), 75) << log;
}

}  // namespace

TEST(CheckpointFaults, SigtermDuringLoadTrainsOneStepSavesAndExits75) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("sigterm_load");
  const fs::path out = tmp.path() / "run", log_path = tmp.path() / "run.log";
  fs::create_directories(out);
  // The weights' read waits 5 s; the signal comes once that pause has begun (its ALPACA_FAULTS
  // line), before any step is logged and before training_args.json (written once set-up is done).
  const auto t0 = std::chrono::steady_clock::now();
  BackgroundRun run = launch_trainer(run_args(out, 100), 1, log_path, "train.pause_in_load=5000");
  const bool parsed = run.wait_for_log("ALPACA_FAULTS: train.pause_in_load pauses");
  const bool stepped = fs::exists(out / "metrics.jsonl") || fs::exists(out / "training_args.json");
  const auto [status, after] = stop_with_sigterm(run);
  const double total = seconds_since(t0);
  const std::string log = read_text(log_path);
  ASSERT_TRUE(parsed) << log;
  ASSERT_FALSE(stepped) << "the signal came after training began: " << log;
  // The notice is kept through the load: one step, a sealed checkpoint, exit 75.
  ASSERT_NO_FATAL_FAILURE(expect_preemption_exit(status, log));
  EXPECT_NE(log.find("stopping after step 1 on a signal; checkpoint saved; exit code 75"), std::string::npos) << log;
  EXPECT_EQ(expect_no_torn_checkpoint(out), 1) << log;
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-1"), "") << log;
  std::cout << "SIGTERM during load: exit " << WEXITSTATUS(status) << " " << after << " s after the signal (" << total
            << " s in all)\n";
}

TEST(CheckpointFaults, SigtermDuringEvaluationFinishesItSavesAndExits75) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("sigterm_eval");
  const fs::path out = tmp.path() / "run", log_path = tmp.path() / "run.log";
  fs::create_directories(out);
  // Evaluation at step 2 (40 examples, 10 rounds of 4), each forward 600 ms late: a 6 s window.
  const std::string args = run_args(out, 100) + " --eval_data_path " + (kFixture / "data.json").string() +
                           " --eval_strategy steps --eval_steps 2 --per_device_eval_batch_size 4";
  BackgroundRun run = launch_trainer(args, 1, log_path, "train.pause_in_eval=600");
  // Step 2's training log is written just before its evaluation starts; the evaluation's first
  // forward announces its pause.
  const bool in_eval =
      run.wait_until([&] { return read_text(out / "metrics.jsonl").find("\"step\":2") != std::string::npos; }, 180) &&
      run.wait_for_log("ALPACA_FAULTS: train.pause_in_eval pauses");
  const bool eval_done = read_text(out / "metrics.jsonl").find("eval_loss") != std::string::npos;
  const auto [status, after] = stop_with_sigterm(run);
  const std::string log = read_text(log_path);
  ASSERT_TRUE(in_eval) << log;
  ASSERT_FALSE(eval_done) << "the signal came after the evaluation: " << log;
  ASSERT_NO_FATAL_FAILURE(expect_preemption_exit(status, log));
  // The evaluation finishes and is logged; the stop is taken at the next step boundary.
  const std::string metrics = read_text(out / "metrics.jsonl");
  EXPECT_NE(metrics.find("eval_loss"), std::string::npos) << metrics;
  EXPECT_NE(log.find("on a signal; checkpoint saved; exit code 75"), std::string::npos) << log;
  EXPECT_GE(expect_no_torn_checkpoint(out), 1) << log;
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-2"), "") << log;
  EXPECT_NE(log.find("stopping after step 3 on a signal"), std::string::npos) << log;
  EXPECT_EQ(alpaca::ckpt::checkpoint_problem(out / "checkpoint-3"), "") << log;
  std::cout << "SIGTERM during evaluation: exit " << WEXITSTATUS(status) << " " << after << " s after the signal\n";
}

namespace {

struct MpiFaultRun {
  int rc = 0;
  double seconds = 0;
  std::string log;
};

// The trainer under `mpirun -np 2` with ALPACA_FAULTS=`fault` and --ddp_timeout `timeout_s`. With
// launcher_aborts false Open MPI is told not to end the job on a rank's non-zero exit (other
// launchers may not either), and `timeout` bounds the run at timeout_s + 30 s (exit 124).
MpiFaultRun run_mpi_fault(const std::string& fault, const fs::path& out, int timeout_s, bool launcher_aborts) {
  std::string cmd = "ALPACA_FAULTS=" + fault + " ";
  if (!launcher_aborts) cmd += "timeout " + std::to_string(timeout_s + 30) + " ";
  cmd += "mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none";
  if (!launcher_aborts) cmd += " --mca orte_abort_on_non_zero_status 0";
  cmd += " -x ALPACA_FAULTS " + train_bin() + " " + run_args(out, 2) + " --ddp_timeout " + std::to_string(timeout_s);
  MpiFaultRun r;
  const auto t0 = std::chrono::steady_clock::now();
  r.rc = run_command(cmd, &r.log);
  r.seconds = seconds_since(t0);
  return r;
}

// After a job that failed before its first collective: no rank trained, none is left running,
// nothing is half-written.
void expect_job_gone(const fs::path& out, const std::string& log) {
  EXPECT_EQ(log.find("step 1"), std::string::npos) << "no rank trained: " << log;
  std::string ps;
  // "[/]" so that the pattern does not match the shell that runs pgrep.
  EXPECT_NE(run_command("pgrep -af 'output_dir [/]" + out.string().substr(1) + "'", &ps), 0) << "a rank is still running: " << ps;
  if (fs::exists(out)) expect_no_torn_checkpoint(out);
}

// Under `fault` (a rank that _exits after MPI_Init) with a launcher that does not end the job,
// the survivor ends on its own within `limit_s` seconds, non-zero and not by `timeout`'s kill
// (124), saying `message`; nothing is left running or half-written. `what` labels the figure.
void expect_survivor_names_missing_rank(const std::string& fault, int timeout_s, int limit_s, const std::string& message,
                                        const std::string& what) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("mpi_rank_dies_noabort");
  const fs::path out = tmp.path() / "out";
  const MpiFaultRun r = run_mpi_fault(fault, out, timeout_s, /*launcher_aborts=*/false);
  EXPECT_NE(r.rc, 0) << r.log;
  EXPECT_NE(r.rc, 124) << "still running after " << timeout_s + 30 << " s: " << r.log;
  EXPECT_LT(r.seconds, limit_s) << r.log;
  EXPECT_NE(r.log.find(message), std::string::npos) << "the missing rank is not named: " << r.log;
  expect_job_gone(out, r.log);
  std::cout << what << ": exit " << r.rc << " after " << r.seconds << " s (--ddp_timeout " << timeout_s << ")\n";
}

}  // namespace

// Two ranks under mpirun; rank 1 _exits right after MPI_Init, before any collective. Rank 0 is
// in its set-up (or its first collective) then; the job must end within --ddp_timeout + a few
// seconds, non-zero, with the missing rank named, nothing left running and nothing half-written.
TEST(CheckpointFaults, MpiPeerThatDiesBeforeTheFirstCollectiveIsNamedWithinTheTimeout) {
  SKIP_WITHOUT_FIXTURE();
  TempDir tmp("mpi_peer_dies");
  const int timeout_s = 10;
  const fs::path out = tmp.path() / "out";
  const MpiFaultRun r = run_mpi_fault("dist.exit_after_init=1", out, timeout_s, /*launcher_aborts=*/true);
  EXPECT_NE(r.rc, 0) << r.log;
  EXPECT_LT(r.seconds, timeout_s + 10) << "took " << r.seconds << " s: " << r.log;
  // Open MPI's launcher names the rank that went away ([jobid,rank]) and its exit code.
  EXPECT_NE(r.log.find(",1]"), std::string::npos) << "the missing rank is not named: " << r.log;
  EXPECT_NE(r.log.find("Exit code:    3"), std::string::npos) << r.log;
  expect_job_gone(out, r.log);
  std::cout << "MPI peer dead before the first collective: exit " << r.rc << " after " << r.seconds << " s (--ddp_timeout "
            << timeout_s << ")\n";
}

// The same fault when the launcher does not end the job for us (Open MPI told not to abort on a
// rank's non-zero exit; other launchers may not either): rank 0 must still end on its own within
// --ddp_timeout + a few seconds, naming rank 1. Without the start-up roll call in dist::init
// (src/dist/runtime.cpp) rank 0 blocked in its first collective (MPI_Comm_dup, then
// MPI_Comm_split_type) for ever: measured still running after 60 s with --ddp_timeout 10.
TEST(CheckpointFaults, MpiPeerThatDiesBeforeTheFirstCollectiveWithoutLauncherAbort) {
  expect_survivor_names_missing_rank("dist.exit_after_init=1", 10, 10 + 10,
                                     "rank 1 of 2 did not answer the start-up roll call within 10 s (--ddp_timeout)",
                                     "MPI peer dead before the first collective, launcher not aborting");
}

// The roll call's other side: rank 0 (which collects it) dies after MPI_Init and the launcher
// does not end the job; rank 1 must give up on its own at --ddp_timeout + 5 s, naming rank 0.
TEST(CheckpointFaults, MpiRankZeroThatDiesBeforeTheFirstCollectiveIsNamedByTheOthers) {
  expect_survivor_names_missing_rank(
      "dist.exit_after_init=0", 5, 5 + 5 + 10,
      "[rank 1]: error: rank 0 did not answer the start-up roll call within 5 s (--ddp_timeout) + 5 s",
      "MPI rank 0 dead before the first collective, launcher not aborting");
}

}  // namespace test_checkpoint_faults

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
#undef SKIP_WITHOUT_MOUNT
