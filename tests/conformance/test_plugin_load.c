/* test_plugin_load.c - the loader refuses plugins built for another ABI or
 * without the vtable symbol, with a message naming the file and, for the
 * ABI, both major versions; a good plugin opens.
 * Usage: test_plugin_load BADABI.so NOSYM.so GOOD.so */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mep/transport.h"

static int failures;

#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                    \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
      failures++;                                                             \
    }                                                                         \
  } while (0)

/* msg with every occurrence of `path` blanked out, so that digits in the
 * path do not count as version numbers. */
static char *without(const char *msg, const char *path) {
  char *s = strdup(msg);
  size_t n = strlen(path);
  for (char *p = strstr(s, path); n && p; p = strstr(p + n, path))
    memset(p, ' ', n);
  return s;
}

/* 1 if `num` appears in s as a whole number (not inside a longer one). */
static int has_number(const char *s, long num) {
  for (const char *p = s; *p; p++) {
    if (!isdigit((unsigned char)*p) || (p > s && isdigit((unsigned char)p[-1])))
      continue;
    char *end;
    long v = strtol(p, &end, 10);
    if (v == num) return 1;
    p = end - 1;
  }
  return 0;
}

static void test_bad_major(const char *path) {
  mep_plugin_t *p = NULL;
  int rc = mep_plugin_open(path, &p);
  const char *msg = mep_last_error();
  EXPECT(rc == MEP_ERR_ABI, "opening %s returned %s, want MEP_ERR_ABI", path,
         mep_strerror(rc));
  EXPECT(p == NULL, "a refused plugin still gave a handle");
  EXPECT(strstr(msg, path) != NULL, "the message does not name the file: %s",
         msg);
  char *rest = without(msg, path);
  EXPECT(has_number(rest, MEP_TRANSPORT_ABI_MAJOR),
         "the message lacks this mep's major ABI %d: %s",
         MEP_TRANSPORT_ABI_MAJOR, msg);
  EXPECT(has_number(rest, MEP_TRANSPORT_ABI_MAJOR + 1),
         "the message lacks the plugin's major ABI %d: %s",
         MEP_TRANSPORT_ABI_MAJOR + 1, msg);
  free(rest);
  printf("bad major ABI: %s\n", msg);
  mep_plugin_close(p);
}

static void test_no_symbol(const char *path) {
  mep_plugin_t *p = NULL;
  int rc = mep_plugin_open(path, &p);
  const char *msg = mep_last_error();
  EXPECT(rc == MEP_ERR_ABI || rc == MEP_ERR_NOT_FOUND,
         "opening %s returned %s, want MEP_ERR_ABI or MEP_ERR_NOT_FOUND",
         path, mep_strerror(rc));
  EXPECT(p == NULL, "a refused plugin still gave a handle");
  EXPECT(strstr(msg, path) != NULL, "the message does not name the file: %s",
         msg);
  EXPECT(strstr(msg, MEP_TRANSPORT_SYMBOL) != NULL,
         "the message does not name the missing symbol: %s", msg);
  printf("missing symbol: %s\n", msg);
  mep_plugin_close(p);
}

static void test_missing_file(const char *dir_of) {
  char path[4096];
  snprintf(path, sizeof path, "%s.does-not-exist/libmep-transport-x.so",
           dir_of);
  mep_plugin_t *p = NULL;
  int rc = mep_plugin_open(path, &p);
  EXPECT(rc < 0, "opening the missing %s returned %s", path,
         mep_strerror(rc));
  EXPECT(strstr(mep_last_error(), path) != NULL,
         "the message does not name the file: %s", mep_last_error());
  mep_plugin_close(p);
}

static void test_good(const char *path) {
  mep_plugin_t *p = NULL;
  int rc = mep_plugin_open(path, &p);
  EXPECT(rc == 0, "opening %s: %s: %s", path, mep_strerror(rc),
         mep_last_error());
  if (rc != 0) return;
  const mep_transport_t *vt = mep_plugin_vtable(p);
  EXPECT(vt && vt->abi_major == MEP_TRANSPORT_ABI_MAJOR,
         "the vtable of %s is not ABI %d", path, MEP_TRANSPORT_ABI_MAJOR);
  EXPECT(strcmp(mep_plugin_path(p), path) == 0, "mep_plugin_path is %s",
         mep_plugin_path(p));
  mep_plugin_close(p);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s BADABI.so NOSYM.so GOOD.so\n", argv[0]);
    return 2;
  }
  test_bad_major(argv[1]);
  test_no_symbol(argv[2]);
  test_missing_file(argv[1]);
  test_good(argv[3]);
  if (failures) fprintf(stderr, "%d failures\n", failures);
  return failures ? 1 : 0;
}
