#include <gtest/gtest.h>

#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace alpaca::test_error {

TEST(Error, CarriesFileLineAndMessage) {
  try {
    ALPACA_CHECK(1 + 1 == 3, "arithmetic is off by " << 1);
    FAIL() << "ALPACA_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "arithmetic is off by 1");
    EXPECT_NE(std::string(e.what()).find("test_error.cpp:"), std::string::npos) << e.what();
  }
}

TEST(Error, ShowsRankOnceKnown) {
  set_process_rank(3);
  try {
    ALPACA_FAIL("boom");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 3]"), std::string::npos) << e.what();
  }
  set_process_rank(-1);
}

TEST(Log, ParsesHfLevelsAndRejectsOthers) {
  EXPECT_EQ(log::parse_level("warning"), log::Level::kWarning);
  EXPECT_EQ(log::parse_level("passive"), log::Level::kPassive);
  EXPECT_THROW(log::parse_level("verbose"), Error);
}

}  // namespace alpaca::test_error
