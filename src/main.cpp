// alpaca-train entry point: the only place that catches errors and chooses an exit code
// (0 success, 1 failure, 2 bad usage: unknown flag, bad value, contradiction). Errors in the
// user's flags (cli::UsageError) and inputs (alpaca::UserError) are the same on every rank and are
// printed once, by rank 0, as a plain message; internal errors keep file:line and the rank.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "alpaca/cli/dispatch.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

int main(int argc, char** argv) {
  try {
    return alpaca::cli::dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const alpaca::cli::UsageError& e) {
    // Every rank parses the same flags and sees the same files, so every rank finds the same
    // usage error: one prints it (rank 0, or the only process), the others just exit.
    if (alpaca::process_rank() <= 0) std::cerr << "alpaca-train: error: " << e.message() << "\n";
    return 2;
  } catch (const alpaca::UserError& e) {
    // A problem with the inputs, found alike by every rank: reported once, without a source location.
    if (alpaca::process_rank() <= 0) std::cerr << "alpaca-train: error: " << e.message() << "\n";
    return 1;
  } catch (const alpaca::Error& e) {
    std::cerr << "alpaca-train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "alpaca-train: error: " << e.what() << "\n";
    return 1;
  }
}
