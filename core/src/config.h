/* config.h - the INI configuration: internal helpers beyond mep.h. */
#ifndef MEP_SRC_CONFIG_H
#define MEP_SRC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "mep/mep.h"
#include "mep/transport.h"

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

/* ------------------------------------------------- the core's own keys
 * The single source of truth for every key of [core], [peer N] and [host
 * NAME], its default and its meaning: mep_config_default, the unknown-key
 * warnings, the checks made at load and the tests of conf/mep.ini and
 * docs/config.md all read it. Plugins declare their sections' keys
 * themselves (transport.h, mep_tp_cfg_key_t); the same checks apply to
 * them through mep__config_check_plugin. */

typedef enum {
  MEP__CFG_STRING = MEP_TP_CFG_STRING, /* free text */
  MEP__CFG_INT = MEP_TP_CFG_INT,       /* in [min, max]; K/M/G suffixes */
  MEP__CFG_BOOL = MEP_TP_CFG_BOOL,     /* 0/1, false/true, no/yes, off/on */
  MEP__CFG_CHOICE = MEP_TP_CFG_CHOICE, /* one of the '|'-separated choices */
  MEP__CFG_RANGE = MEP_TP_CFG_RANGE,   /* 0, or LO-HI in [min, max] */
  MEP__CFG_LIST = 100, /* comma list of transport names, optionally led by ^ */
  MEP__CFG_NAME = 101, /* one transport name */
} mep__config_kind_t;

typedef struct mep__config_key {
  /* "core"; "peer" and "host" stand for every [peer N] and [host NAME]
   * section; a plugin's name for its declared keys. */
  const char *section;
  const char *key;
  const char *def; /* the documented default; NULL when there is none */
  mep__config_kind_t kind;
  int64_t min, max;    /* INT, RANGE */
  const char *choices; /* CHOICE: "adaptive|spin|blocking" */
  const char *doc;     /* what the key does */
} mep__config_key_t;

/* The entry a plugin's declaration stands for, in section `section`. */
mep__config_key_t mep__config_key_of(const char *section,
                                     const mep_tp_cfg_key_t *k);

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

/* mep__config_check_value that also converts: INT into *a, BOOL into *a
 * (0 or 1), CHOICE into *a (the index of the choice), RANGE into *a and *b
 * ("0": both 0). a and b may be NULL for the other kinds. */
int mep__config_value(const mep__config_key_t *k, const char *section,
                      const char *value, const char *origin, int64_t *a,
                      int64_t *b);

/* A plugin's section against its declaration: every declared key's value
 * (file or MEP_<SECTION>_<KEY>) is checked (MEP_ERR_CONFIG for the first
 * bad one), a key of the file's [section] that is not declared is a
 * warning naming file and line, and so is a MEP_<SECTION>_* variable that
 * names no declared key. */
int mep__config_check_plugin(const mep_config_t *cfg, const char *section,
                             const mep_tp_cfg_key_t *keys, size_t n);

/* mep__config_int with the table's default and bounds of a known INT key. */
int mep__config_known_int(const mep_config_t *cfg, const char *section,
                          const char *key, int64_t *out);

/* For a known CHOICE key: *index is the position of its value (or of the
 * default when unset) among the choices, e.g. 1 for progress = spin. */
int mep__config_choice(const mep_config_t *cfg, const char *section,
                       const char *key, int *index);

#endif
