// quintet::comm_error: what a communicator throws when a collective cannot complete: a peer
// failed, a peer did not arrive in time, or the ranks disagree about what they are doing.
#pragma once

#include <quintet/core/error.hpp>

namespace quintet {

class comm_error : public error {
 public:
  using error::error;
};

}  // namespace quintet
