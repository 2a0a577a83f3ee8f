/* config.h - the INI configuration: internal helpers beyond mep.h. */
#ifndef MEP_SRC_CONFIG_H
#define MEP_SRC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "mep/mep.h"

/* The environment variable that overrides section/key:
 * "MEP_" + upper(section) + "_" + upper(key), with every character that is
 * not [A-Za-z0-9] written as '_'. Returns the length it needs (without the
 * NUL), as snprintf does. */
size_t mep__config_env_name(const char *section, const char *key, char *buf,
                            size_t len);

/* Reads an integer value (decimal, optional K/M/G binary suffix for sizes)
 * of section/key, or `def` when unset. MEP_ERR_CONFIG naming the key, the
 * value and where it came from (file:line or the environment variable) for
 * anything that is not an integer in [min, max]. */
int mep__config_int(const mep_config_t *cfg, const char *section,
                    const char *key, int64_t def, int64_t min, int64_t max,
                    int64_t *out);

/* Where section/key was set, for messages: "MEP_TCP_PORT_RANGE" or
 * "/etc/mep.ini:12", or "default". Static per-thread buffer. */
const char *mep__config_origin(const mep_config_t *cfg, const char *section,
                               const char *key);

/* The file's sections in file order, for [peer N] and [host NAME]. */
size_t mep__config_section_count(const mep_config_t *cfg);
const char *mep__config_section_name(const mep_config_t *cfg, size_t i);
/* The line the section header stood on. */
int mep__config_section_line(const mep_config_t *cfg, size_t i);

/* ------------------------------------------------- the table of known keys
 * The single source of truth for every key mep knows, its default and its
 * meaning: mep_config_default, the unknown-key warnings, the checks made at
 * load and the tests of conf/mep.ini and docs/config.md all read it. */

typedef enum {
  MEP__CFG_STRING, /* free text */
  MEP__CFG_INT,    /* integer in [min, max]; K/M/G suffixes allowed */
  MEP__CFG_CHOICE, /* one of the '|'-separated `choices` */
  MEP__CFG_LIST,   /* comma list of transport names, optionally led by ^ */
  MEP__CFG_NAME,   /* one transport name */
  MEP__CFG_PORTS,  /* 0 (ephemeral) or LO-HI, 1 <= LO <= HI <= 65535 */
} mep__config_kind_t;

typedef struct mep__config_key {
  /* "core", "tcp", ...; "peer" and "host" stand for every [peer N] and
   * [host NAME] section. */
  const char *section;
  const char *key;
  const char *def; /* the documented default; NULL when there is none */
  mep__config_kind_t kind;
  int64_t min, max;    /* MEP__CFG_INT */
  const char *choices; /* MEP__CFG_CHOICE: "adaptive|spin|blocking" */
  const char *doc;     /* one line: what the key does */
} mep__config_key_t;

size_t mep__config_key_count(void);
const mep__config_key_t *mep__config_key_at(size_t i);
/* The entry of section/key ("peer 3"/"transport" finds the peer entry), or
 * NULL for a key mep does not know. */
const mep__config_key_t *mep__config_key_find(const char *section,
                                              const char *key);

/* Checks `value` of a known key against its kind, for values that did not
 * come through a mep_config_t (MEP_TRANSPORTS...). `origin` says where it
 * came from in the message. MEP_ERR_CONFIG or 0. */
int mep__config_check_value(const mep__config_key_t *k, const char *section,
                            const char *value, const char *origin);

/* mep__config_int with the table's default and bounds of a known INT key. */
int mep__config_known_int(const mep_config_t *cfg, const char *section,
                          const char *key, int64_t *out);

/* For a known CHOICE key: *index is the position of its value (or of the
 * default when unset) among the choices, e.g. 1 for progress = spin. */
int mep__config_choice(const mep_config_t *cfg, const char *section,
                       const char *key, int *index);

#endif
