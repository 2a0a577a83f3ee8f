/* version.c - the library version. */
#include "mep/mep.h"

#define MEP_STR_(x) #x
#define MEP_STR(x) MEP_STR_(x)

const char *mep_version(void) {
  return MEP_STR(MEP_VERSION_MAJOR) "." MEP_STR(MEP_VERSION_MINOR) "." MEP_STR(
      MEP_VERSION_PATCH);
}
