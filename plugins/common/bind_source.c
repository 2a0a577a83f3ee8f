/* bind_source.c - see bind_source.h. */
#include "bind_source.h"

#include <sys/socket.h>

int mep__bind_source(int fd, const struct sockaddr_in *addr) {
  struct sockaddr_in me = *addr;
  me.sin_port = 0;
#ifdef IP_BIND_ADDRESS_NO_PORT
  /* Linux 4.2 and later; an older kernel refuses the option and picks the
   * port at bind() as before */
  int one = 1;
  (void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#endif
  return bind(fd, (struct sockaddr *)&me, sizeof me);
}
