/* link.h - the socketpair between the two ranks of a check: address and
 * rkey blobs, small values and barriers, framed as {tag, length, bytes}.
 * Every receive has a deadline, and while it waits it keeps the plugin
 * progressing (a transport may need poll() on both sides to move data). */
#ifndef PC_LINK_H
#define PC_LINK_H

#include <stddef.h>
#include <stdint.h>

/* Tags name what a message is, so that two ranks out of step are caught. */
enum {
  PC_TAG_BARRIER = 1,
  PC_TAG_ADDR,
  PC_TAG_ANSWER,
  PC_TAG_RKEY,
  PC_TAG_VALUE,
  PC_TAG_PID,
};

/* Called while a receive waits; NULL for none. */
void pc_link_set_progress(void (*fn)(void *arg), void *arg);

void pc_link_send(int tag, const void *buf, size_t len);
/* Receives the next message, which must carry `tag`; returns its length
 * (at most cap). `what` names it in the failure messages. */
size_t pc_link_recv(int tag, void *buf, size_t cap, const char *what);

void pc_link_send_u64(int tag, uint64_t v);
uint64_t pc_link_recv_u64(int tag, const char *what);

/* Both ranks reach this point. With progress == 0 the plugin is not
 * polled while waiting: used right before close, so that neither side
 * sees the other's close as a failure while still polling. */
void pc_link_barrier(int progress, const char *what);

#endif
