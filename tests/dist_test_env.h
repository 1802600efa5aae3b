// The communicator of a multi-rank test process: one per process, created by a GoogleTest
// environment before the first test (dist::init + make_communicator) and torn down after the last
// (reset + dist::finalize). A test file registers it once at namespace scope:
//   const auto* g_env = alpaca::testing::register_job_comm(options);
// and reaches it with job_comm(). A module's test files share one executable (tests/CMakeLists.txt),
// so several files register: the first registration makes the environment and the others reuse it
// (they must ask for the same options).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "alpaca/dist/runtime.h"

namespace alpaca::testing {

inline std::shared_ptr<dist::Communicator>& job_comm_slot() {
  static std::shared_ptr<dist::Communicator> comm;
  return comm;
}

inline std::shared_ptr<dist::Communicator> job_comm() { return job_comm_slot(); }

class JobCommEnvironment : public ::testing::Environment {
 public:
  explicit JobCommEnvironment(dist::CommOptions options) : options_(std::move(options)) {}
  void SetUp() override {
    dist::init();
    job_comm_slot() = dist::make_communicator(options_);
  }
  void TearDown() override {
    job_comm_slot().reset();
    dist::finalize();
  }

 private:
  dist::CommOptions options_;
};

inline ::testing::Environment* register_job_comm(dist::CommOptions options) {
  static const dist::CommOptions first = options;
  static ::testing::Environment* const env = ::testing::AddGlobalTestEnvironment(new JobCommEnvironment(options));
  if (options.backend != first.backend || options.cuda != first.cuda || options.timeout != first.timeout) {
    std::fprintf(stderr, "register_job_comm: two test files of one executable ask for different communicator "
                         "options; give them the same, or OWN_EXECUTABLE in tests/CMakeLists.txt\n");
    std::abort();
  }
  return env;
}

}  // namespace alpaca::testing
