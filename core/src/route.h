/* route.h - choosing one transport per peer from both ranks' cards.
 *
 * A card is what a rank publishes at communicator creation: its host, the
 * transports it allows in priority order (with the address blob of each one
 * that initialised, or why it did not) and its route-override rules. The
 * choice for a pair is a pure function of the two cards, so both ranks
 * reach the same answer without another exchange. */
#ifndef MEP_SRC_ROUTE_H
#define MEP_SRC_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "mep/mep.h"

typedef struct mep__card_tp {
  char *name;
  int available;   /* loaded and initialised */
  char *reason;    /* why not, when !available */
  uint8_t *addr;   /* address blob, when available */
  size_t addr_len;
} mep__card_tp_t;

typedef struct mep__rule {
  int is_peer;     /* 1: [peer N], 0: [host NAME] */
  int64_t peer;
  char *host;
  char *transport;
  char *origin;    /* "mep.ini:12", for messages */
} mep__rule_t;

typedef struct mep__card {
  int rank;
  char *host_id;
  char *hostname;
  int ntp;
  mep__card_tp_t *tp; /* priority order */
  int nrules;
  mep__rule_t *rules; /* in file order */
} mep__card_t;

void mep__card_encode(const mep__card_t *card, mep__wbuf_t *out);
/* The card's entry for transport `name`, or NULL. */
const mep__card_tp_t *mep__card_find(const mep__card_t *card,
                                     const char *name);
/* MEP_ERR_PROTOCOL for a blob that is not a well-formed card. */
int mep__card_decode(const void *blob, size_t len, mep__card_t *card);
void mep__card_free(mep__card_t *card);

/* Asks the local transport `name` whether it reaches rank `peer`, described
 * by `peer_tp`: 1 yes, 0 no (why filled), negative on error. */
typedef int (*mep__reach_fn)(void *arg, const char *name, int peer,
                             const mep__card_tp_t *peer_tp, char *why,
                             size_t why_len);

/* Picks the transport between the ranks of `me` and `peer`:
 *  1. a matching override rule ([peer N] touching either rank beats
 *     [host NAME] matching either host's name or id; the first in the file
 *     wins); both cards are consulted and must not contradict each other
 *     (MEP_ERR_CONFIG naming both rules);
 *  2. else the first transport of the LOWER rank's list that is available
 *     on both sides and reachable.
 * On success *name points into `me`. MEP_ERR_UNREACHABLE names the peer and
 * the reason of each transport. */
int mep__route_pick(const mep__card_t *me, const mep__card_t *peer,
                    mep__reach_fn reach, void *arg, const char **name);

/* Parses a transport list ("nvlink,tcp" or "^verbs,ibgda") against the
 * default list. Writes up to `max` names (malloc'ed) to out and their
 * count to *n; *explicit_list is 1 unless the list was an exclusion or
 * the default. MEP_ERR_CONFIG for an empty or malformed list. */
int mep__route_parse_list(const char *list, const char *default_list,
                          char **out, int max, int *n, int *explicit_list);

#endif
