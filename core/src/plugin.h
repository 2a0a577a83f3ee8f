/* plugin.h - loading transport plugins (dlopen) and checking their ABI. */
#ifndef MEP_SRC_PLUGIN_H
#define MEP_SRC_PLUGIN_H

#include <stddef.h>

#include "mep/transport.h"

struct mep_plugin {
  void *handle;              /* dlopen handle */
  const mep_transport_t *vt; /* the exported struct */
  char *path;                /* the file it came from */
};

/* The plugin's declared configuration keys (ABI 1.3), or NULL with *n 0. */
static inline const mep_tp_cfg_key_t *mep__plugin_keys(
    const mep_transport_t *vt, size_t *n) {
  int has = MEP_TP_HAS(vt, mep_transport_t, config_nkeys) &&
            vt->config_keys && vt->config_nkeys;
  *n = has ? vt->config_nkeys : 0;
  return has ? vt->config_keys : NULL;
}

#endif
