/* error.h - the thread-local error message behind mep_last_error(). */
#ifndef MEP_SRC_ERROR_H
#define MEP_SRC_ERROR_H

#include <stdarg.h>

#include "mep/mep.h"

/* Sets the calling thread's message (printf style) and returns `code`, so
 * a failure reads: return mep__err(MEP_ERR_TIMEOUT, "store: get %s", k); */
int mep__err(int code, const char *fmt, ...) MEP_PRINTF(2, 3);

/* va_list form of mep__err. */
int mep__verr(int code, const char *fmt, va_list ap) MEP_PRINTF(2, 0);

/* Like mep__err, with ": <strerror(errno_value)>" appended. */
int mep__err_errno(int code, int errno_value, const char *fmt, ...)
    MEP_PRINTF(3, 4);

/* Prefixes the current message with "<prefix>: " (for context added by a
 * caller) and returns `code`. */
int mep__err_wrap(int code, const char *fmt, ...) MEP_PRINTF(2, 3);

/* Clears the calling thread's message. */
void mep__err_clear(void);

#endif
