/* store.h - what the core asks of the built-in store's client (store.c)
 * beyond mep_store_t.
 *
 * A thread may name a flag that cancels its requests to the built-in
 * store: once the flag is set, a request of that thread that waits (for
 * the connection, the server's reply or a retry's backoff) gives up within
 * MEP__STORE_CANCEL_MS with MEP_ERR_CLOSED. The fault-tolerance claim runs
 * its requests so, and mep_comm_destroy sets the flag instead of waiting
 * out a store that stopped answering (docs/fault-tolerance.md). A store of
 * the caller's own learns of it through mep_store_cancelled (mep.h), and
 * is waited for if it does not ask. */
#ifndef MEP_STORE_H
#define MEP_STORE_H

#include <stdatomic.h>

#define MEP__STORE_CANCEL_MS 50

/* Names `flag` (NULL: none) for this thread's later requests; the flag
 * must outlive them. */
void mep__store_cancel_on(const atomic_int *flag);

#endif
