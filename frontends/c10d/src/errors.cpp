// errors.cpp - see errors.hpp.
#include "errors.hpp"

#include <c10/util/Exception.h>
#include <mep/mep.h>

namespace mep_c10d {

static std::string sentence(int rc, const std::string &what,
                            const std::string &detail, int timeout_ms) {
  std::string msg = "mep: " + what;
  if (rc == MEP_ERR_TIMEOUT) {
    msg += ": Timed out waiting";
    if (timeout_ms >= 0) msg += " " + std::to_string(timeout_ms) + "ms";
  }
  if (!detail.empty()) msg += ": " + detail;
  return msg + " (" + mep_strerror(rc) + ")";
}

void throw_mep(int rc, const std::string &what, int timeout_ms) {
  C10_THROW_ERROR(DistBackendError,
                  sentence(rc, what, mep_last_error(), timeout_ms));
}

std::exception_ptr mep_error(int rc, const std::string &what,
                             const std::string &detail, int timeout_ms) {
  try {
    C10_THROW_ERROR(DistBackendError,
                    sentence(rc, what, detail, timeout_ms));
  } catch (...) {
    return std::current_exception();
  }
}

void throw_value(const std::string &msg) {
  C10_THROW_ERROR(ValueError, "mep: " + msg);
}

void throw_type(const std::string &msg) {
  C10_THROW_ERROR(TypeError, "mep: " + msg);
}

void throw_closed(const std::string &what) {
  C10_THROW_ERROR(DistBackendError,
                  "mep: " + what + ": the process group was shut down "
                  "(destroy_process_group or abort); create a new one");
}

}  // namespace mep_c10d
