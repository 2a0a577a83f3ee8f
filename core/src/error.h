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

#define MEP__ERRMSG_LEN 1024

/* The calling thread's message, kept across cleanup that may overwrite
 * it, so a failure is reported with its own cause:
 *   mep__errsave_t s;
 *   mep__err_save(&s);
 *   mep_comm_destroy(comm);
 *   return mep__err_restore(&s, rc);  (the code and the saved message) */
typedef struct mep__errsave {
  char msg[MEP__ERRMSG_LEN];
} mep__errsave_t;
void mep__err_save(mep__errsave_t *s);
int mep__err_restore(const mep__errsave_t *s, int code);

#endif
