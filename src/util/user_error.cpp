// alpaca::UserError; see include/alpaca/util/user_error.h.
#include "alpaca/util/user_error.h"

namespace alpaca::detail {

void throw_user_error(const char* file, int line, const std::string& msg) { throw UserError(file, line, msg); }

}  // namespace alpaca::detail
