/* queue.c - the FIFO of queued sends and of completions not yet polled. */
#include "shm.h"

void shm_queue_push(shm_queue_t *q, shm_op_t *op) {
  op->next = NULL;
  if (q->tail)
    q->tail->next = op;
  else
    q->head = op;
  q->tail = op;
}

shm_op_t *shm_queue_pop(shm_queue_t *q) {
  shm_op_t *op = q->head;
  if (!op) return NULL;
  q->head = op->next;
  if (!q->head) q->tail = NULL;
  op->next = NULL;
  return op;
}
