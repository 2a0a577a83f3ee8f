/* plugin.h - loading transport plugins (dlopen) and checking their ABI. */
#ifndef MEP_SRC_PLUGIN_H
#define MEP_SRC_PLUGIN_H

#include "mep/transport.h"

struct mep_plugin {
  void *handle;              /* dlopen handle */
  const mep_transport_t *vt; /* the exported struct */
  char *path;                /* the file it came from */
};

/* True when the plugin's struct is large enough to hold `field`. */
#define MEP_TP_HAS(vt, field)                                                 \
  ((vt)->struct_size >= offsetof(mep_transport_t, field) + sizeof((vt)->field))

#endif
