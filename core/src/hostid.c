/* hostid.c - an id equal in every process of one host, different across
 * hosts: $MEP_HOST_ID, else "hostname/boot id". Containers on one host
 * share the boot id but usually not the hostname, which is what plugins
 * like nvlink and shm need: same kernel AND same namespace view. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mep/transport.h"

static char host_id[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void read_boot_id(char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return;
  if (fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

static void compute(void) {
  const char *env = getenv("MEP_HOST_ID");
  if (env && *env) {
    snprintf(host_id, sizeof host_id, "%s", env);
    return;
  }
  char name[256] = "unknown-host", boot[64];
  gethostname(name, sizeof name - 1);
  read_boot_id(boot, sizeof boot);
  snprintf(host_id, sizeof host_id, "%s/%s", name, boot);
}

const char *mep_host_id(void) {
  pthread_once(&once, compute);
  return host_id;
}
