/* log.h - leveled log lines with a rank prefix. */
#ifndef MEP_SRC_LOG_H
#define MEP_SRC_LOG_H

#include <stdarg.h>

#include "mep/mep.h"

void mep__log(mep_log_level_t level, const char *fmt, ...) MEP_PRINTF(2, 3);
void mep__vlog(mep_log_level_t level, const char *fmt, va_list ap)
    MEP_PRINTF(2, 0);

/* The rank shown in the prefix of this process's lines; -1 hides it. */
void mep__log_set_rank(int rank);

/* Applies a configured level unless MEP_LOG already chose one. */
void mep__log_default_level(mep_log_level_t level);

#define MEP_LOG_ON(lvl) ((lvl) <= mep_log_get_level())
#define mep__error(...) mep__log(MEP_LOG_ERROR, __VA_ARGS__)
#define mep__warn(...) mep__log(MEP_LOG_WARN, __VA_ARGS__)
#define mep__info(...) mep__log(MEP_LOG_INFO, __VA_ARGS__)
#define mep__debug(...)                                                       \
  do {                                                                        \
    if (MEP_LOG_ON(MEP_LOG_DEBUG)) mep__log(MEP_LOG_DEBUG, __VA_ARGS__);      \
  } while (0)

#endif
