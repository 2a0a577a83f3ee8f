/* ft_util.c - clocks, allocation, /proc counts and environment numbers. */
#include "ft_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long long ft_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ft_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void *ft_xmalloc(size_t len) {
  void *p = malloc(len ? len : 1);
  CHECK(p != NULL, "out of memory allocating %zu bytes", len);
  return p;
}

void *ft_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  CHECK(p != NULL, "out of memory allocating %zu x %zu bytes", n, size);
  return p;
}

int ft_count_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

long long ft_env_num(const char *name, long long dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 0);
  CHECK(errno == 0 && end && *end == '\0', "$%s='%s' is not a number", name,
        v);
  return x;
}

const char *ft_env_str(const char *name) {
  const char *v = getenv(name);
  CHECK(v != NULL && *v, "$%s is not set (this program runs ranks only for "
        "the ft driver)", name);
  return v;
}

uint64_t ft_rand3(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t s = seed ^ (a * 0x9e3779b97f4a7c15ull);
  splitmix64(&s);
  s ^= b * 0xc2b2ae3d27d4eb4full;
  return splitmix64(&s);
}
