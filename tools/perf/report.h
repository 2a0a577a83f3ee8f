/* report.h - mep-perf's table: rank 0 collects every rank's time and wrong
 * count for a row through the store (not through mep's collectives, which
 * are what is being measured) and prints the row. */
#ifndef MEP_PERF_REPORT_H
#define MEP_PERF_REPORT_H

#include "perf.h"

typedef struct perf_report {
  double busbw_sum;
  int rows;
  uint64_t wrong; /* over every rank and row, known on rank 0 */
  double start_s; /* when the sweep began, for the progress line */
} perf_report_t;

/* Rank 0 prints the preamble and the column heads. */
void perf_report_begin(const perf_rank_t *r, perf_report_t *rep);

/* Publishes this rank's average time (us) and wrong count of row `row`;
 * rank 0 waits for every rank's, prints the row and, on sweeps longer than
 * 5 s, a progress line to stderr. Returns 0 or the store's error. */
int perf_report_row(const perf_rank_t *r, perf_report_t *rep, int row,
                    double time_us, uint64_t wrong);

/* Rank 0 prints the averages and the wrong count. */
void perf_report_end(const perf_rank_t *r, const perf_report_t *rep);

double perf_now_s(void);

#endif
