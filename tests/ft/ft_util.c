/* ft_util.c - clocks, allocation, /proc counts and environment numbers. */
#include "ft_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Adds to ino[] the inodes of the sockets in /proc/self/net/<file> whose
 * remote port is `port`. */
static int socks_to(const char *file, int port, unsigned long *ino, int n,
                    int max) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/self/net/%s", file);
  FILE *f = fopen(path, "r");
  if (!f) return n;
  while (n < max && fgets(line, sizeof line, f)) {
    char rem[64];
    unsigned rport;
    unsigned long inode;
    /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
    if (sscanf(line, "%*s %*s %63s %*s %*s %*s %*s %*s %*s %lu", rem,
               &inode) != 2)
      continue; /* the heading */
    char *colon = strrchr(rem, ':');
    if (colon && sscanf(colon + 1, "%x", &rport) == 1 &&
        (int)rport == port && inode)
      ino[n++] = inode;
  }
  fclose(f);
  return n;
}

void ft_count_fds(int port, int *fds, int *to_port) {
  unsigned long ino[256];
  int nino = socks_to("tcp", port, ino, 0, 256);
  nino = socks_to("tcp6", port, ino, nino, 256);
  *fds = *to_port = 0;
  DIR *d = opendir("/proc/self/fd");
  CHECK(d != NULL, "cannot read /proc/self/fd");
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, target, sizeof target - 1);
    unsigned long inode = 0;
    int mine = 0;
    if (len > 0) {
      target[len] = '\0';
      if (sscanf(target, "socket:[%lu]", &inode) == 1)
        for (int i = 0; i < nino; i++) mine |= ino[i] == inode;
    }
    if (mine)
      ++*to_port;
    else
      ++*fds;
  }
  closedir(d);
  --*fds; /* the directory's own */
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
