#include "alpaca/ckpt/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace alpaca::ckpt {
namespace {

// Lock-free atomics are async-signal-safe; nothing else is touched inside the handler.
std::atomic<int> g_signal{0};
std::atomic<int> g_sigint_count{0};
bool g_installed = false;
struct sigaction g_old_term, g_old_usr1, g_old_int;

void on_signal(int sig) {
  if (sig == SIGINT && g_sigint_count.fetch_add(1) >= 1) {
    static const char kMsg[] = "\nalpaca-train: second SIGINT, stopping now without saving\n";
    ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    (void)ignored;
    ::_exit(kExitInterrupted);
  }
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  if (sig == SIGINT) {
    static const char kMsg[] =
        "\nalpaca-train: SIGINT, finishing this step and saving a checkpoint (SIGINT again stops at once)\n";
    ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    (void)ignored;
  }
}

}  // namespace

void install_preemption_handlers() {
  if (g_installed) return;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
  sigaction(SIGINT, &sa, &g_old_int);
  g_installed = true;
}

void uninstall_preemption_handlers() {
  if (!g_installed) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  g_installed = false;
}

StopRequest stop_requested() { return g_signal.load() != 0 ? StopRequest::kSaveAndExit : StopRequest::kNone; }

int stop_signal() { return g_signal.load(); }

int exit_code_for_stop(int signal_number) {
  if (signal_number == SIGINT) return kExitInterrupted;
  return kExitPreempted;
}

void request_stop(int signal_number) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal_number);
}

void clear_stop_request() {
  g_signal.store(0);
  g_sigint_count.store(0);
}

}  // namespace alpaca::ckpt
