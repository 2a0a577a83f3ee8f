/*
 * entry.h - what the in-tree plugins' entry points do alike: check the
 * core's env at init, hand their props over, and pick the number that
 * tells their context from a replacement's. Each module compiles its own
 * copy (plugins/common/meson.build).
 */
#ifndef MEP_PLUGINS_ENTRY_H
#define MEP_PLUGINS_ENTRY_H

#include <stdint.h>

#include "mep/transport.h"

/* 1 when env can be used at all: not NULL, and reaching log and set_error,
 * through which every failure after this one is told. */
int mep__tp_env_ok(const mep_tp_env_t *env);

/* 0 when env has the typed configuration reads (cfg_int, cfg_range,
 * cfg_str: a core of transport ABI 1.3 or later); else MEP_ERR_ABI, with
 * a message naming the plugin `name`. */
int mep__tp_env_typed(const mep_tp_env_t *env, const char *name);

/* Copies of *full what props->struct_size covers into props: a core built
 * against an older transport.h passes a shorter struct. */
void mep__tp_props_put(mep_tp_props_t *props, const mep_tp_props_t *full);

/* A random number, never 0, for a context's incarnation or nonce: a
 * replacement of a rank (same rank, same secret) is told from the process
 * it replaces. Where getrandom fails, the clock, the pid and salt (any
 * address of the context) mixed. */
uint64_t mep__tp_incarnation(const void *salt);

#endif
