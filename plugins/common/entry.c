/* entry.c - see entry.h. */
#include "entry.h"

#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int mep__tp_env_ok(const mep_tp_env_t *env) {
  return env && MEP_TP_HAS(env, mep_tp_env_t, set_error) && env->log &&
         env->set_error;
}

int mep__tp_env_typed(const mep_tp_env_t *env, const char *name) {
  if (MEP_TP_HAS(env, mep_tp_env_t, cfg_str) && env->cfg_int &&
      env->cfg_range && env->cfg_str)
    return 0;
  env->set_error("%s: this libmep is older than transport ABI 1.3 (typed "
                 "configuration reads); rebuild %s against it", name, name);
  return MEP_ERR_ABI;
}

void mep__tp_props_put(mep_tp_props_t *props, const mep_tp_props_t *full) {
  uint32_t size = props->struct_size;
  memcpy(props, full, size < sizeof *full ? size : sizeof *full);
  props->struct_size = size;
}

uint64_t mep__tp_incarnation(const void *salt) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
        ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)salt;
    v ^= v >> 31;
    v *= 0x9e3779b97f4a7c15ull;
  }
  return v ? v : 1;
}
