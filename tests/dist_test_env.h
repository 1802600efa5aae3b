// The communicator of a multi-rank test process: one per process, created by a GoogleTest
// environment before the first test (dist::init + make_communicator) and torn down after the last
// (reset + dist::finalize). A test file registers it once at namespace scope:
//   const auto* g_env = alpaca::testing::register_job_comm(options);
// and reaches it with job_comm().
#pragma once

#include <gtest/gtest.h>

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
  return ::testing::AddGlobalTestEnvironment(new JobCommEnvironment(std::move(options)));
}

}  // namespace alpaca::testing
