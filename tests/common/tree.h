/* tree.h - the order in which the logarithmic all-reduce plan
 * (core/src/plan_log.c) combines n contributions, for the tests'
 * references: of the first 2e (e = n - m, m the largest power of two
 * <= n) adjacent pairs fold, lower first; then adjacent blocks of 1, 2,
 * 4 ... of the m results, lower first.
 *
 * tree_applies says when it is used.
 *
 * TREE_REDUCE(v, n, combine) reduces v[0..n-1] (in rank order, n >= 1)
 * in place into v[0] with combine(lower, higher). */
#ifndef MEP_TESTS_TREE_H
#define MEP_TESTS_TREE_H

#include <stddef.h>
#include <stdlib.h>

#include <mep/mep.h>

/* Whether an all-reduce of `bytes` (> 0) over n ranks takes that plan, by
 * [core] log_ranks and log_bytes as the environment sets them, or their
 * defaults. */
static inline int tree_applies(size_t bytes, int n) {
  const char *r = getenv("MEP_CORE_LOG_RANKS"),
             *b = getenv("MEP_CORE_LOG_BYTES");
  if (!r || !*r) r = mep_config_default("core", "log_ranks");
  if (!b || !*b) b = mep_config_default("core", "log_bytes");
  long long ranks = atoll(r);
  return bytes > 0 && ranks > 0 && n >= ranks &&
         bytes <= strtoull(b, NULL, 10);
}

#define TREE_REDUCE(v, n, combine)                                         \
  do {                                                                     \
    int m_ = 1;                                                            \
    while (m_ * 2 <= (n)) m_ *= 2;                                         \
    int e_ = (n) - m_;                                                     \
    for (int j_ = 0; j_ < m_; j_++)                                        \
      (v)[j_] = j_ < e_ ? combine((v)[2 * j_], (v)[2 * j_ + 1])            \
                        : (v)[j_ + e_];                                    \
    for (int w_ = 1; w_ < m_; w_ *= 2)                                     \
      for (int j_ = 0; j_ < m_; j_ += 2 * w_)                              \
        (v)[j_] = combine((v)[j_], (v)[j_ + w_]);                          \
  } while (0)

#endif
