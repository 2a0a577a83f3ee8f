/* error.c - error codes, their names and the thread-local message. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char errmsg[MEP__ERRMSG_LEN];

static const char *const names[] = {
    [0] = "MEP_OK: success",
    [-MEP_ERR_INVALID] = "MEP_ERR_INVALID: invalid argument",
    [-MEP_ERR_NOMEM] = "MEP_ERR_NOMEM: out of memory",
    [-MEP_ERR_SYSTEM] = "MEP_ERR_SYSTEM: system call failed",
    [-MEP_ERR_TIMEOUT] = "MEP_ERR_TIMEOUT: timed out",
    [-MEP_ERR_UNAVAILABLE] = "MEP_ERR_UNAVAILABLE: not available here",
    [-MEP_ERR_NOT_FOUND] = "MEP_ERR_NOT_FOUND: not found",
    [-MEP_ERR_ABI] = "MEP_ERR_ABI: plugin ABI version mismatch",
    [-MEP_ERR_CONFIG] = "MEP_ERR_CONFIG: bad configuration",
    [-MEP_ERR_PEER_FAILED] = "MEP_ERR_PEER_FAILED: peer failed",
    [-MEP_ERR_UNREACHABLE] = "MEP_ERR_UNREACHABLE: no transport reaches the peer",
    [-MEP_ERR_MISMATCH] = "MEP_ERR_MISMATCH: ranks disagree",
    [-MEP_ERR_PROTOCOL] = "MEP_ERR_PROTOCOL: malformed message",
    [-MEP_ERR_BOUNDS] = "MEP_ERR_BOUNDS: access outside a registered region",
    [-MEP_ERR_AUTH] = "MEP_ERR_AUTH: peer failed authentication",
    [-MEP_ERR_UNSUPPORTED] = "MEP_ERR_UNSUPPORTED: not supported",
    [-MEP_ERR_CLOSED] = "MEP_ERR_CLOSED: closed",
    [-MEP_ERR_EXCLUDED] = "MEP_ERR_EXCLUDED: dropped from the group by the "
                          "other ranks",
};

const char *mep_strerror(int code) {
  if (code == MEP_OK_DEGRADED)
    return "MEP_OK_DEGRADED: finished over the surviving ranks";
  if (code > 0 || code < MEP_ERR_LAST || !names[-code])
    return "MEP_ERR_?: unknown error code";
  return names[-code];
}

const char *mep_last_error(void) { return errmsg; }

void mep__err_clear(void) { errmsg[0] = '\0'; }

void mep__err_save(mep__errsave_t *s) {
  snprintf(s->msg, sizeof s->msg, "%s", errmsg);
}

int mep__err_restore(const mep__errsave_t *s, int code) {
  return mep__err(code, "%s", s->msg);
}

int mep__verr(int code, const char *fmt, va_list ap) {
  vsnprintf(errmsg, sizeof errmsg, fmt, ap);
  return code;
}

int mep__err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mep__verr(code, fmt, ap);
  va_end(ap);
  return code;
}

int mep__err_errno(int code, int errno_value, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(errmsg, sizeof errmsg, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof errmsg)
    snprintf(errmsg + n, sizeof errmsg - (size_t)n, ": %s",
             strerror(errno_value));
  return code;
}

int mep_set_error(int code, int wrap, const char *fmt, ...) {
  char msg[MEP__ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return wrap ? mep__err_wrap(code, "%s", msg) : mep__err(code, "%s", msg);
}

int mep__err_wrap(int code, const char *fmt, ...) {
  char old[MEP__ERRMSG_LEN];
  memcpy(old, errmsg, sizeof old);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(errmsg, sizeof errmsg, fmt, ap);
  va_end(ap);
  /* Appends ": <old>", cut to what is left (the newest context first). */
  if (n >= 0 && (size_t)n + 2 < sizeof errmsg) {
    size_t room = sizeof errmsg - (size_t)n - 3, len = strnlen(old, room);
    memcpy(errmsg + n, ": ", 2);
    memcpy(errmsg + n + 2, old, len);
    errmsg[(size_t)n + 2 + len] = '\0';
  }
  return code;
}
