// errors.hpp - how the shim turns mep failures and bad arguments into the
// exceptions Python sees (torch maps c10 errors to Python types).
#pragma once

#include <exception>
#include <string>

namespace mep_c10d {

// The failing call's code with the calling thread's mep_last_error():
// "mep: <what>: <last error> (MEP_ERR_...)" as torch.distributed.DistBackendError.
// A timeout reads "mep: <what>: Timed out waiting <ms>ms: <last error>
// (MEP_ERR_TIMEOUT: timed out)", as torch's checks and users' log filters
// look for "Timed out" (gloo's words); timeout_ms < 0 leaves out the ms.
[[noreturn]] void throw_mep(int rc, const std::string &what,
                            int timeout_ms = -1);

// The same error, held for a Work or a Future to raise later.
std::exception_ptr mep_error(int rc, const std::string &what,
                             const std::string &detail, int timeout_ms = -1);

// Bad arguments from the caller: ValueError / TypeError in Python.
[[noreturn]] void throw_value(const std::string &msg);
[[noreturn]] void throw_type(const std::string &msg);

// The backend was shut down (destroy_process_group) and used again.
[[noreturn]] void throw_closed(const std::string &what);

}  // namespace mep_c10d
